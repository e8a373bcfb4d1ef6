"""Permissions for the admin's Pause, Resume and Backfill (still no table)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("beat_claims", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="entry",
            options={
                "verbose_name": "entry",
                "verbose_name_plural": "entries",
                "permissions": [("release_claim", "Can release a stuck claim"),
                                ("trigger_run", "Can trigger a run now"),
                                ("pause_entry", "Can pause an entry"),
                                ("resume_entry", "Can resume a paused entry"),
                                ("backfill_entry", "Can backfill an entry's past occurrences")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
