"""The rate-limit counters as an UNLOGGED table on PostgreSQL: every authenticated request
bumps one, and a write to an unlogged table commits without waiting for a WAL flush to disk.
What it gives up is only the counters themselves after a PostgreSQL crash (unlogged tables
come back empty), which at worst lets a team's current window start over. SQLite has no
such thing: nothing to do there."""

from django.db import migrations


def set_unlogged(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE e2bfacade_ratelimitwindow SET UNLOGGED")


def set_logged(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE e2bfacade_ratelimitwindow SET LOGGED")


class Migration(migrations.Migration):
    dependencies = [("e2bfacade", "0002_rate_limit_window")]

    operations = [migrations.RunPython(set_unlogged, set_logged)]
