"""``manage.py beat_claims_status [--json]``: what ``celery claims status`` prints."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from beat_claims import inspect
from beat_claims.cli import status_table

from ...apps import celery_app


class Command(BaseCommand):
    help = "Every beat-claims entry: next run, last outcome, current claims, counts by state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        doc = inspect.status(celery_app())
        self.stdout.write(json.dumps(doc, indent=2) if options["json"] else status_table(doc))
