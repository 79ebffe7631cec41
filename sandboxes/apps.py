from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = 'django.db.models.BigAutoField'
    name = "sandboxes"
