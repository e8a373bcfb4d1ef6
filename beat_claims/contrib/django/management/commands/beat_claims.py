"""``manage.py beat_claims status|history``: what ``celery claims status|history`` print,
for the project's Celery app and its schedules (the database's, with the database
scheduler)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from beat_claims.cli import history_table, status_table
from beat_claims.inspect import UnknownEntry
from beat_claims.settings import ConfigurationError
from beat_claims.stores import StoreConfigurationError, StoreError

from ... import status as source


class Command(BaseCommand):
    help = "Inspect beat-claims: entries, claims, outcomes and history (as `celery claims`)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", metavar="{status,history}")
        sub.required = True
        status = sub.add_parser(
            "status", help="Every entry: next run, last outcome, current claims, counts.")
        status.add_argument("--json", action="store_true", help="Print one JSON document.")
        history = sub.add_parser("history", help="The runs of ENTRY, newest first.")
        history.add_argument("entry", metavar="ENTRY")
        history.add_argument("--limit", type=int, default=20, help="Newest N runs (20).")
        history.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["subcommand"] == "status":
                doc = source.status()
                text = json.dumps(doc, indent=2) if options["json"] else status_table(doc)
            else:
                doc = source.history(options["entry"], options["limit"])
                text = json.dumps(doc, indent=2) if options["json"] else history_table(doc)
        except UnknownEntry as exc:
            raise CommandError(f"beat-claims: {exc}") from None
        except (StoreError, StoreConfigurationError, OSError, ConfigurationError) as exc:
            raise CommandError(f"beat-claims: {type(exc).__name__}: {exc}") from exc
        self.stdout.write(text)
