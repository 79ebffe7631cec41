from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "snapshots"
