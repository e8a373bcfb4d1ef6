"""Permissions for the admin's editing of entries defined at run time: add, change (edit,
enable, disable) and delete (still no table)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("beat_claims", "0002_entry_pause_resume_backfill_permissions")]

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
                "default_permissions": ("add", "change", "delete", "view"),
            },
        ),
    ]
