"""Ended builds keep nothing derived from their registry credentials: their spec digests
(a plain SHA-256 over the spec and the credentials, before the digest was keyed) are
cleared. A running build's is cleared when it ends."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def forget(apps: Any, schema_editor: Any) -> None:
    TemplateBuild = apps.get_model("templates", "TemplateBuild")
    TemplateBuild.objects.filter(status__in=("ready", "error")).exclude(spec_digest="").update(
        spec_digest=""
    )


class Migration(migrations.Migration):
    dependencies = [("templates", "0008_build_host_and_running_since")]

    operations = [migrations.RunPython(forget, migrations.RunPython.noop)]
