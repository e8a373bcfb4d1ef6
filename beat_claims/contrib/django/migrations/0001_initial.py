"""The unmanaged ``Entry`` model: no table is created; Django creates its permissions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Entry",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "entry",
                "verbose_name_plural": "entries",
                "db_table": "beat_claims_entry_unmanaged",
                "permissions": [("release_claim", "Can release a stuck claim"),
                                ("trigger_run", "Can trigger a run now")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
