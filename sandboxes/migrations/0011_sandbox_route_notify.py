"""The trigger that announces a sandbox's route (sandboxes/routes.py): on PostgreSQL, every insert,
change of host or state, and delete of a sandbox row sends ``NOTIFY e2bfacade_sandbox_routes``
with its id, delivered at commit. SQLite has no NOTIFY: the syncer polls there."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION e2bfacade_sandbox_route_notify() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('e2bfacade_sandbox_routes', OLD.sandbox_id);
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.host IS DISTINCT FROM OLD.host
            OR (NEW.state = 'killed') IS DISTINCT FROM (OLD.state = 'killed') THEN
        PERFORM pg_notify('e2bfacade_sandbox_routes', NEW.sandbox_id);
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER e2bfacade_sandbox_route
    AFTER INSERT OR UPDATE OR DELETE ON sandboxes_sandbox
    FOR EACH ROW EXECUTE FUNCTION e2bfacade_sandbox_route_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS e2bfacade_sandbox_route ON sandboxes_sandbox;
DROP FUNCTION IF EXISTS e2bfacade_sandbox_route_notify();
"""


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("sandboxes", "0010_secrets_egress_proxy_and_identity")]

    operations = [migrations.RunPython(forward, backward)]
