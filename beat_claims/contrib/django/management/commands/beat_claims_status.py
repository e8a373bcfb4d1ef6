"""``manage.py beat_claims_status [--json]``: deprecated, use ``beat_claims status``."""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Deprecated: use `manage.py beat_claims status [--json]`."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stderr.write("beat_claims_status is deprecated: use `manage.py beat_claims"
                          " status`.")
        call_command("beat_claims", "status", *(["--json"] if options["json"] else []),
                     stdout=self.stdout, stderr=self.stderr)
