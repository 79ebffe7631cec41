"""The built-in public ``base`` template: the host's /usr, read-only, over a fresh /etc.

Its runtime image is the driver's built-in "base" image, built on first use, so migrating needs no root and no sandbox support.
"""

from django.db import migrations


def create_base(apps, schema_editor):  # type: ignore[no-untyped-def]
    Template = apps.get_model("templates", "Template")
    Template.objects.get_or_create(
        template_id="base",
        defaults={"alias": "base", "image_id": "base", "team": None, "kind": "template"},
    )


class Migration(migrations.Migration):
    dependencies = [("templates", "0001_initial")]

    operations = [migrations.RunPython(create_base, migrations.RunPython.noop)]
