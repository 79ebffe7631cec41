from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sandboxes"

    def ready(self) -> None:
        from e2bfacade.crypto import EncryptedColumn, register_encrypted_column
        from e2bfacade.observability import register_scrape_collector
        from sandboxes import idempotent  # noqa: F401  (registers the sandbox create operations)
        from sandboxes.observability import SANDBOX_STATES, VOLUME_STATES

        register_scrape_collector(SANDBOX_STATES)
        register_scrape_collector(VOLUME_STATES)
        register_encrypted_column(
            EncryptedColumn("sandboxes.SecretVersion", "value_encrypted", "secret versions")
        )
        register_encrypted_column(
            EncryptedColumn("sandboxes.Sandbox", "egress_proxy_password", "egress proxy passwords")
        )
        register_encrypted_column(
            EncryptedColumn("sandboxes.IdentityKey", "private_key_encrypted", "identity keys")
        )
