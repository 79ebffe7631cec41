from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"

    def ready(self) -> None:
        # Registers the idempotent sandbox, snapshot and fork operations.
        from sandboxes import idempotent  # noqa: F401
