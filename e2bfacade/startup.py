"""What the service checks before it serves: no secret anyone can read.

``SECRET_KEY`` signs the admin's sessions and, unless ``IDEMPOTENCY_ENCRYPTION_KEYS`` is set,
is what the key encrypting stored idempotency bodies (each holding a sandbox's
``envdAccessToken``) is derived from. Its built-in default is in this file, so it is public:
with ``DEBUG`` off, the service refuses to start on it (or on an empty or Django
``django-insecure-`` key), and no encryption key is ever derived from it, ``DEBUG`` or not.

:func:`refuse_insecure_secrets` runs where the service starts: ``e2bfacade/wsgi.py``
(gunicorn) and ``manage.py`` (the lifecycle worker, migrations, every command). The settings
module itself stays importable with the built-in key, so that tools which load it without
serving anything (mypy's Django plugin, pytest-django) keep working.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

# Public by construction: never let it sign or encrypt anything that leaves a laptop.
BUILTIN_SECRET_KEY = "e2bfacade-insecure-local-only"

MAKE_SECRET_KEY = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"

SECRET_KEY_REFUSED = (
    "SECRET_KEY is not set (or is the built-in insecure value) and DEBUG is off: refusing to "
    "start. Set SECRET_KEY to a long random value in the environment or in .env beside "
    f'manage.py, e.g. `echo "SECRET_KEY=$({MAKE_SECRET_KEY})" >> .env` '
    "(scripts/serve.sh writes one into .env on its first run)."
)
# Raised here at start, and by e2bfacade/crypto.py should anything encrypt regardless.
ENCRYPTION_KEY_REFUSED = (
    "IDEMPOTENCY_ENCRYPTION_KEYS is not set and SECRET_KEY is not set (or is the built-in "
    "insecure value): refusing to derive the key that encrypts stored idempotency bodies from "
    f'a public value. Set SECRET_KEY (e.g. `echo "SECRET_KEY=$({MAKE_SECRET_KEY})" >> .env`) '
    "or IDEMPOTENCY_ENCRYPTION_KEYS (see docs/configuration.md)."
)


def is_insecure_secret_key(value: str) -> bool:
    """True for a SECRET_KEY that anyone can know: empty, the built-in default, or one of
    Django's ``django-insecure-`` placeholders."""
    return not value or value == BUILTIN_SECRET_KEY or value.startswith("django-insecure-")


def refuse_insecure_secrets() -> None:
    """Raise ImproperlyConfigured, naming the variable and how to set it, unless the
    service's secrets are real: SECRET_KEY (unless DEBUG is on) and the idempotency
    encryption keys (always: they are either set or derived from a real SECRET_KEY)."""
    from django.conf import settings

    insecure = is_insecure_secret_key(settings.SECRET_KEY)
    if insecure and not settings.DEBUG:
        raise ImproperlyConfigured(SECRET_KEY_REFUSED)
    if insecure and not settings.IDEMPOTENCY_ENCRYPTION_KEYS:
        raise ImproperlyConfigured(ENCRYPTION_KEY_REFUSED)
