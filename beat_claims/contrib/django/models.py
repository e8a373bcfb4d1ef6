"""An unmanaged model: no table, only something for the admin to register and permissions.

Entries and runs live in the beat-claims store (Redis), not in the database; the admin
reads them from there. The model gives the admin its place in the index and gives Django
the permissions operators are granted: view; add, change (edit, enable, disable) and
delete an entry defined at run time; release a claim, trigger a run, pause an entry, resume
it, backfill it.
"""

from __future__ import annotations

from django.db import models


class Entry(models.Model):
    """A schedule entry as the store knows it (never saved: ``managed = False``)."""

    name = models.CharField(max_length=200, primary_key=True)

    class Meta:
        managed = False
        db_table = "beat_claims_entry_unmanaged"
        verbose_name = "entry"
        verbose_name_plural = "entries"
        default_permissions = ("add", "change", "delete", "view")
        permissions = [
            ("release_claim", "Can release a stuck claim"),
            ("trigger_run", "Can trigger a run now"),
            ("pause_entry", "Can pause an entry"),
            ("resume_entry", "Can resume a paused entry"),
            ("backfill_entry", "Can backfill an entry's past occurrences"),
        ]

    def __str__(self) -> str:
        return self.name
