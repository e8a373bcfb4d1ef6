"""The documentation site builds without a warning, its references are the code's, and the
README stays the short overview whose links all lead somewhere.

The settings and CLI references are generated when the site is built (``docs/hooks.py``,
mkdocs-click): these tests read the built pages, so a setting or a command the code has
and the site lacks fails here, as does a broken link or anchor (``mkdocs build --strict``).
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from beat_claims.cli import claims
from beat_claims.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly (every warning an error) outside the checkout."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _commands(group: click.Group, prefix: str) -> Iterator[str]:
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        yield path
        if isinstance(command, click.Group):
            yield from _commands(command, path)


def test_the_site_builds_with_every_setting_in_its_settings_reference(site: Path) -> None:
    text = _text(site / "reference" / "settings" / "index.html")
    missing = [f"beat_claims_{name}" for name in SETTINGS
               if f"beat_claims_{name}" not in text]
    assert not missing, f"the built settings reference lacks {missing}"


def test_the_site_builds_with_every_cli_command_in_its_cli_reference(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    headings = {html.unescape(re.sub(r"<[^>]+>", "", h)).strip()
                for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", page, re.S)}
    commands = list(_commands(claims, "celery claims"))
    assert len(commands) > 10, commands
    missing = [c for c in commands if not any(h.startswith(c) and
                                              h[len(c):].strip(" ¶") == "" for h in headings)]
    assert not missing, f"the built CLI reference has no heading for {missing}: {headings}"


def test_the_readme_is_a_short_overview() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines: the detail belongs in docs/")


def test_every_relative_link_of_the_readme_points_at_a_file() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [t.split("#", 1)[0] for t in targets
                if not re.match(r"[a-z]+://", t) and not t.startswith("#")]
    assert relative, "README.md links to no file"
    broken = [t for t in relative if not (ROOT / t).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"
