from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "snapshots"

    def ready(self) -> None:
        from snapshots import idempotent  # noqa: F401  (registers the snapshot and fork operations)
