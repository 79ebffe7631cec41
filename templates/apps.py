from django.apps import AppConfig


class TemplatesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "templates"

    def ready(self) -> None:
        from templates.builds import idempotent  # noqa: F401  (registers the build request)
