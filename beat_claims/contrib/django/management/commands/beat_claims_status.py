"""``manage.py beat_claims_status [--json]``: what ``celery claims status`` prints."""

from __future__ import annotations

import importlib
import io
import json
from contextlib import redirect_stdout
from types import ModuleType, SimpleNamespace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...apps import celery_app


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise CommandError(f"{name} is missing: this version of beat-claims cannot show"
                           " status") from None


class Command(BaseCommand):
    help = "Every beat-claims entry: next run, last outcome, current claims, counts by state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        app = celery_app()
        if options["json"]:
            doc = _module("beat_claims.inspect").status(app)
            self.stdout.write(json.dumps(doc, indent=2, default=str))
            return
        # The table is the CLI's own, so both always print the same thing.
        cli = _module("beat_claims.cli")
        out = io.StringIO()
        with redirect_stdout(out):
            cli.claims.main(["status"], prog_name="beat_claims_status",
                            obj=SimpleNamespace(app=app), standalone_mode=False)
        self.stdout.write(out.getvalue(), ending="")
