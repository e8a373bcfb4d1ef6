"""``manage.py beat_claims_status [--json]``: what ``celery claims status`` prints."""

from __future__ import annotations

import importlib
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...apps import celery_app


class Command(BaseCommand):
    help = "Show each beat-claims entry, its next and recent runs, and the live beats."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            inspect = importlib.import_module("beat_claims.inspect")
        except ModuleNotFoundError as exc:
            if exc.name != "beat_claims.inspect":
                raise
            raise CommandError("beat_claims.inspect is missing: this version of beat-claims"
                               " cannot show status yet") from None
        if not hasattr(inspect, "status"):
            raise CommandError("beat_claims.inspect has no status(app) function")
        data = inspect.status(celery_app())
        formatter = getattr(inspect, "format_status", None)
        if options["json"] or formatter is None:
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            self.stdout.write(formatter(data))
