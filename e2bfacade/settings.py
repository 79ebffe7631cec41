"""e2bfacade settings: everything comes from the environment through django-environ.

Every variable but SECRET_KEY is optional for a local run (SQLite file, local runtime under
``/var/lib/e2bfacade``); ``scripts/serve.sh`` generates SECRET_KEY into ``.env``. A malformed
value stops the process at start with a message naming the variable, never a half-configured
service. ``.env`` (beside manage.py) is read into the settings only, never into os.environ.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured

from e2bfacade.runtime import registry as runtime_registry
from e2bfacade.startup import BUILTIN_SECRET_KEY

if TYPE_CHECKING:
    from e2bfacade.runtime.local.net.rules import NetworkConfig

# Lets `admin.ModelAdmin[Team]` and friends be subscripted at runtime, as django-stubs types them.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


class _Env(environ.Env):  # type: ignore[misc]  # django-environ ships no type hints
    # What the settings read: a copy of the process environment with .env's values added
    # where the environment has none (a real variable wins, as with read_env into
    # os.environ). .env never reaches os.environ, so no child process — the sandbox launcher,
    # the sandboxes, anything a command spawns — inherits SECRET_KEY or DATABASE_URL from it.
    ENVIRON: dict[str, str] = dict(os.environ)


_Env.read_env(BASE_DIR / ".env", overwrite=False)  # fills _Env.ENVIRON, not os.environ
env = _Env()


def _int(name: str, default: int, low: int, high: int | None, what: str) -> int:
    """An integer setting within [low, high]; ``what`` says the range in the refusal."""
    try:
        value: int = env.int(name, default=default)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {env.str(name)!r}") from exc
    if value < low or (high is not None and value > high):
        raise ImproperlyConfigured(f"{name} must be {what}, got {value}")
    return value


def _positive_int(name: str, default: int) -> int:
    return _int(name, default, 1, None, "positive")


def _seconds(name: str, default: float) -> float:
    try:
        value: float = env.float(name, default=default)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must be a number of seconds, got {env.str(name)!r}"
        ) from exc
    if not 0 <= value <= 3600:
        raise ImproperlyConfigured(f"{name} must be between 0 and 3600 seconds, got {value}")
    return value


DEBUG = env.bool("DEBUG", default=False)
# The built-in default is public: with DEBUG off the service refuses to start on it, and no
# encryption key is derived from it (e2bfacade/startup.py). scripts/serve.sh generates a real
# one into .env on its first run. Loading the settings alone does not refuse, so that tools
# (mypy's Django plugin, pytest-django) can import them.
SECRET_KEY = env.str("SECRET_KEY", default=BUILTIN_SECRET_KEY)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "e2bfacade",
    "templates",
    "sandboxes",
    "snapshots",
    "idempotency",
    "nodes",
]

MIDDLEWARE = [
    # Request id, request metrics and the JSON request log line: outside everything, so it
    # times the whole request and logs the final (already E2B-shaped) status.
    "e2bfacade.observability.RequestObservabilityMiddleware",
    # Outermost but one, so that it sees every error response any layer below produced.
    "e2bfacade.errors.ErrorShapeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "e2bfacade.middleware.RejectNulMiddleware",
    # Serves the admin's and the API docs' static files from gunicorn itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "e2bfacade.urls"
# E2B paths carry no trailing slash; never redirect a POST to add one.
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "e2bfacade.wsgi.application"

try:
    DATABASES = {
        "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
    }
except (environ.ImproperlyConfigured, ValueError) as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from exc
# django-environ accepts any scheme and returns an empty ENGINE for text that is not a URL,
# which would otherwise surface later as a KeyError. Name the variable, never echo the URL:
# it may hold a password.
if DATABASES["default"].get("ENGINE") not in {
    "django.db.backends.sqlite3",
    "django.db.backends.postgresql",
}:
    raise ImproperlyConfigured(
        "DATABASE_URL must be a sqlite:// or postgres:// URL (the only supported databases)"
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and a busy timeout let several gunicorn workers share the embedded file.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# Request bodies: 1 MiB at most (the parser enforces the same limit and a nesting depth).
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"  # filled by collectstatic (serve.sh)
# Without collectstatic (tests, a quick run) whitenoise finds files in the apps directly.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["e2bfacade.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["e2bfacade.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "e2bfacade.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["e2bfacade.throttling.TeamRateThrottle"],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "e2bfacade",
    "DESCRIPTION": (
        "An E2B-compatible sandbox control plane. Field names are exactly as on the wire; "
        "every error body is {code, message, error_code?}."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],  # the schema and docs are public
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",  # the default
        "e2bfacade.schema.wire_path_parameters",  # {sandboxID}, {templateID} as on the wire
    ],
    "SWAGGER_UI_DIST": "SIDECAR",  # served from this host: no CDN needed
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {},
}

# Per-team request rate: API_RATE_LIMIT requests per API_RATE_WINDOW_SECONDS (0: no limit).
API_RATE_LIMIT = _int("API_RATE_LIMIT", 6000, 0, None, "0 (off) or positive")
API_RATE_WINDOW_SECONDS = _positive_int("API_RATE_WINDOW_SECONDS", 60)
# How long a process trusts an API key it has resolved before it asks the database again
# (0: every request asks). A revoked key stops working within this many seconds.
API_KEY_CACHE_SECONDS = _int("API_KEY_CACHE_SECONDS", 5, 0, 3600, "between 0 and 3600")
# The operator's token for E2B's admin routes and for managing any team's keys
# (X-Admin-Token). Empty: every admin token is refused. At least 32 characters: it is as
# strong a secret as SECRET_KEY.
E2BFACADE_ADMIN_TOKEN = env.str("E2BFACADE_ADMIN_TOKEN", default="")
if E2BFACADE_ADMIN_TOKEN and len(E2BFACADE_ADMIN_TOKEN) < 32:
    raise ImproperlyConfigured("E2BFACADE_ADMIN_TOKEN must be at least 32 characters long")

# A fleet (docs/fleet.md): with ETCD_ENDPOINTS, this host registers in etcd under a lease of
# FLEET_LEASE_SECONDS and serves sandbox work only while its renewals are acknowledged
# (e2bfacade/fleet/membership.py). Without it, the host is a fleet of one, as before.
ETCD_ENDPOINTS = env.list("ETCD_ENDPOINTS", default=[])
FLEET_PREFIX = env.str("FLEET_PREFIX", default="/e2bfacade/")
if not FLEET_PREFIX.startswith("/") or not FLEET_PREFIX.endswith("/"):
    raise ImproperlyConfigured(f"FLEET_PREFIX must start and end with '/', got {FLEET_PREFIX!r}")
FLEET_LEASE_SECONDS = _int("FLEET_LEASE_SECONDS", 8, 3, 60, "between 3 and 60")
FLEET_HOST_NAME = env.str("FLEET_HOST_NAME", default="") or socket.gethostname()
FLEET_API_URL = env.str("FLEET_API_URL", default="")
FLEET_SANDBOX_URL = env.str("FLEET_SANDBOX_URL", default="")
if ETCD_ENDPOINTS and not (FLEET_API_URL and FLEET_SANDBOX_URL):
    raise ImproperlyConfigured(
        "with ETCD_ENDPOINTS, FLEET_API_URL and FLEET_SANDBOX_URL must say where the other "
        "hosts and the front reach this host's API and data plane"
    )
if ETCD_ENDPOINTS and DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    raise ImproperlyConfigured(
        "with ETCD_ENDPOINTS, DATABASE_URL must be PostgreSQL: the hosts of a fleet share "
        "one database, which SQLite cannot be"
    )

# --- sandboxes -------------------------------------------------------------------------
SANDBOX_RUNTIME = env.str("SANDBOX_RUNTIME", default="local")
if SANDBOX_RUNTIME not in runtime_registry.DRIVERS:
    raise ImproperlyConfigured(
        f"SANDBOX_RUNTIME={SANDBOX_RUNTIME!r} is not a known driver; this build has: "
        + ", ".join(runtime_registry.driver_names())
    )
SANDBOX_ROOT = Path(env.str("SANDBOX_ROOT", default="/var/lib/e2bfacade"))
if not SANDBOX_ROOT.is_absolute():
    raise ImproperlyConfigured(f"SANDBOX_ROOT must be an absolute path, got {str(SANDBOX_ROOT)!r}")
SANDBOX_MAX_TIMEOUT_SECONDS = _positive_int("SANDBOX_MAX_TIMEOUT_SECONDS", 24 * 3600)
# A sandbox's logs (GET /sandboxes/{id}/logs): at most this many entries and bytes of
# messages per sandbox, the oldest dropped first, kept this long after it is killed (the
# lifecycle worker purges them).
SANDBOX_LOG_MAX_ENTRIES = _positive_int("SANDBOX_LOG_MAX_ENTRIES", 1000)
SANDBOX_LOG_MAX_BYTES = _positive_int("SANDBOX_LOG_MAX_BYTES", 256 * 1024)
SANDBOX_LOG_RETENTION_SECONDS = _positive_int("SANDBOX_LOG_RETENTION_SECONDS", 7 * 24 * 3600)
# Team metrics (GET /teams/{teamID}/metrics): one sample per team per this many seconds,
# kept this long.
TEAM_METRICS_STEP_SECONDS = _int("TEAM_METRICS_STEP_SECONDS", 10, 1, 3600, "between 1 and 3600")
TEAM_METRICS_RETENTION_SECONDS = _positive_int("TEAM_METRICS_RETENTION_SECONDS", 7 * 24 * 3600)
# The most a snapshot may capture of a sandbox's written files; a larger one is refused
# with a 400 (the host's disk is shared by every sandbox, the database and the service).
SANDBOX_SNAPSHOT_MAX_MB = _positive_int("SANDBOX_SNAPSHOT_MAX_MB", 10 * 1024)

# Volumes (sandboxes/volumes/): each volume is a file system of this many MB (a guest or the
# content API meets ENOSPC past it, never the host's disk); a team's volumes together may
# allocate at most VOLUME_MAX_MB_PER_TEAM (a create past it is refused); a volume token is
# valid this long (GET /volumes/{id} mints a fresh one).
VOLUME_MAX_MB = _positive_int("VOLUME_MAX_MB", 1024)
VOLUME_MAX_MB_PER_TEAM = _positive_int("VOLUME_MAX_MB_PER_TEAM", 10 * 1024)
VOLUME_TOKEN_SECONDS = _positive_int("VOLUME_TOKEN_SECONDS", 24 * 3600)

# Template bases (templates/builds/): the registry every image pull goes to instead of the
# image's own (http:// is plain HTTP, https:// verified; empty: none), what else a pull may
# reach besides public addresses (CIDRs, addresses, host names: templates/builds/egress.py),
# the largest image a pull accepts (its compressed layers, MB), where the Debian bases are
# cached (bases/) and where pulled images are (this service's own: its teams' private
# images are in it).
TEMPLATE_REGISTRY_MIRROR = env.str("TEMPLATE_REGISTRY_MIRROR", default="").rstrip("/") or None
if TEMPLATE_REGISTRY_MIRROR is not None and not re.match(
    r"^https?://[^/]+$", TEMPLATE_REGISTRY_MIRROR
):
    raise ImproperlyConfigured(
        "TEMPLATE_REGISTRY_MIRROR must be http://host[:port] or https://host[:port], "
        f"got {TEMPLATE_REGISTRY_MIRROR!r}"
    )


def _registry_allow() -> tuple[str, ...]:
    """CIDRs, addresses and host names (templates/builds/egress.py reads them)."""
    entries = tuple(e.strip() for e in env.list("TEMPLATE_REGISTRY_ALLOW", default=[]))
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if not re.fullmatch(
                r"(?=.{1,253}\.?$)([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+", entry
            ):
                raise ImproperlyConfigured(
                    f"TEMPLATE_REGISTRY_ALLOW: {entry!r} is not a CIDR, an address or a host name"
                ) from None
    return tuple(e for e in entries if e)


TEMPLATE_REGISTRY_ALLOW = _registry_allow()
TEMPLATE_IMAGE_MAX_MB = _positive_int("TEMPLATE_IMAGE_MAX_MB", 4096)
# All of one team's template images together: the layers its builds captured, its
# templates' files and final images (a build that would pass it ends error).
TEMPLATE_IMAGES_MAX_MB_PER_TEAM = _positive_int("TEMPLATE_IMAGES_MAX_MB_PER_TEAM", 20 * 1024)
TEMPLATE_CACHE_DIR = Path(env.str("TEMPLATE_CACHE_DIR", default="/var/cache/e2bfacade"))
if not TEMPLATE_CACHE_DIR.is_absolute():
    raise ImproperlyConfigured(
        f"TEMPLATE_CACHE_DIR must be an absolute path, got {str(TEMPLATE_CACHE_DIR)!r}"
    )
TEMPLATE_PULL_CACHE_DIR = Path(
    env.str("TEMPLATE_PULL_CACHE_DIR", default=str(SANDBOX_ROOT / "pulled-images"))
)
if not TEMPLATE_PULL_CACHE_DIR.is_absolute():
    raise ImproperlyConfigured(
        f"TEMPLATE_PULL_CACHE_DIR must be an absolute path, got {str(TEMPLATE_PULL_CACHE_DIR)!r}"
    )
# Admission (sandboxes/admission.py): sandboxes a team may have at once (0: no limit), and
# how far the memory and disk given to live sandboxes may exceed what the host has.
SANDBOX_MAX_CONCURRENT_PER_TEAM = _int(
    "SANDBOX_MAX_CONCURRENT_PER_TEAM", 100, 0, None, "0 (no limit) or positive"
)


def _ratio(name: str, default: float) -> float:
    try:
        value = float(env.float(name, default=default))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {env.str(name)!r}") from exc
    if not 0 < value <= 100:
        raise ImproperlyConfigured(f"{name} must be a ratio between 0 and 100, got {value}")
    return float(value)


SANDBOX_MEMORY_OVERCOMMIT = _ratio("SANDBOX_MEMORY_OVERCOMMIT", 4.0)
SANDBOX_DISK_OVERCOMMIT = _ratio("SANDBOX_DISK_OVERCOMMIT", 4.0)
# Keyword options of the driver, from the settings above that belong to it.
# Spare launchers and pooled disks the local runtime keeps ready (0: none; every create
# then joins its cgroups and formats its disk itself: about 15 ms more on a quiet host).
SANDBOX_SPARES = _int("SANDBOX_SPARES", 2, 0, 64, "between 0 and 64")
# Per template with a start command (code-interpreter-v1), sandboxes kept started ahead so
# a create takes one (the warm pool, runtime/local/pools/warm.py); 0: every create starts its own.
SANDBOX_WARM_POOL = _int("SANDBOX_WARM_POOL", 1, 0, 64, "between 0 and 64")


def _egress_port() -> int | None:
    """``SANDBOX_EGRESS_PORT``: the egress proxy's port on 127.0.0.1, or None for ``auto``
    (chosen when the runtime root is registered, unique among this host's roots)."""
    raw = env.str("SANDBOX_EGRESS_PORT", default="auto").strip()
    if raw.lower() == "auto":
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ImproperlyConfigured(
            f"SANDBOX_EGRESS_PORT must be 'auto' or a port (1-65535), got {raw!r}"
        )
    return int(raw)


# The drivers built on the local one (its storage, networking and options): the gvisor
# driver runs the same sandboxes under runsc.
LOCAL_FAMILY = ("local", "gvisor")


def _sandbox_network() -> NetworkConfig | None:
    """The local runtime's networking (e2bfacade/runtime/local/net/network.py), or None.

    ``SANDBOX_UPLINK``: the interface sandbox traffic leaves by; ``auto`` (the default) is
    the host's default route's, ``none`` turns networking off (sandboxes get their own
    loopback only, and ``allow_internet_access: true`` is refused)."""
    uplink = env.str("SANDBOX_UPLINK", default="auto")
    if uplink == "none" or SANDBOX_RUNTIME not in LOCAL_FAMILY:
        return None
    from e2bfacade.runtime.local.net.network import default_route
    from e2bfacade.runtime.local.net.rules import DEFAULT_BLOCKED, NetworkConfig

    gateway = env.str("SANDBOX_UPLINK_GATEWAY", default="") or None
    if uplink == "auto":
        route = default_route()
        if route is None:
            return None  # no way out: sandboxes stay on their own loopback
        uplink, gateway = route[0], gateway or route[1]
    blocked = env.list("SANDBOX_BLOCKED_CIDRS", default=list(DEFAULT_BLOCKED))
    blocked += env.list("SANDBOX_EXTRA_BLOCKED_CIDRS", default=[])
    try:
        return NetworkConfig(
            uplink=uplink,
            gateway=gateway,
            cidr=env.str("SANDBOX_NETWORK_CIDR", default="10.250.0.0/18"),
            dns_servers=tuple(env.list("SANDBOX_DNS_SERVERS", default=["8.8.8.8"])),
            blocked=tuple(blocked),
            proxy_port=_egress_port(),
            extra_ca=env.str("SANDBOX_EXTRA_CA_CERTS", default="") or None,
        )
    except (ValueError, OSError) as exc:
        raise ImproperlyConfigured(f"sandbox networking: {exc}") from exc


SANDBOX_NETWORK = _sandbox_network()
# Internet access of a sandbox whose create omits allow_internet_access (E2B: allowed).
SANDBOX_INTERNET_DEFAULT = env.bool("SANDBOX_INTERNET_DEFAULT", default=True)
SANDBOX_RUNTIME_OPTIONS: dict[str, object] = (
    {
        "snapshot_max_bytes": SANDBOX_SNAPSHOT_MAX_MB << 20,
        "spares": SANDBOX_SPARES,
        "warm": SANDBOX_WARM_POOL,
        "network": SANDBOX_NETWORK,
    }
    if SANDBOX_RUNTIME in LOCAL_FAMILY
    else {}
)

# The ``domain`` of every sandbox answer (create, connect, resume, fork, GET). Without
# E2B_SANDBOX_URL the SDKs send a sandbox's data-plane calls — its envdAccessToken, the
# user's commands and files — to ``https://<port>-<sandboxID>.<domain>``; were domain null
# (and E2B_DOMAIN unset) they would fall back to e2b.app, E2B's cloud. The default,
# ``localhost``, keeps that traffic on this machine: ``*.localhost`` is reserved for loopback
# (RFC 6761), so such a name resolves to 127.0.0.1/::1 or to nothing, never to a public host.
# A deployment serving sandboxes by host name sets its wildcard domain here (``[:port]``
# allowed); E2B's own domains are refused.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_E2B_DOMAINS = (
    "e2b.app",
    "e2b.dev",
    "e2b.pro",
    "e2b-staging.dev",
    "e2b-tango.dev",
    "e2b-juliett.dev",
)


def _sandbox_domain(name: str, default: str) -> str:
    value: str = env.str(name, default=default).lower()
    host, colon, port = value.partition(":")
    labels = host.split(".")
    if (
        len(host) > 253
        or not all(_DNS_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()  # an IP address: the SDK prepends "<port>-<sandboxID>."
        or (colon and not (port.isdigit() and 1 <= int(port) <= 65535))
    ):
        raise ImproperlyConfigured(
            f"{name} must be a DNS domain with an optional :port, without scheme or path "
            f"(e.g. localhost or sandboxes.example.com:8443), got {value!r}"
        )
    if any(host == d or host.endswith("." + d) for d in _E2B_DOMAINS):
        raise ImproperlyConfigured(
            f"{name}={value!r} is E2B's own domain: the SDKs would send every sandbox call "
            "(its access token, commands and files) to E2B's cloud"
        )
    return value


SANDBOX_DOMAIN = _sandbox_domain("SANDBOX_DOMAIN", "localhost")

# --- data plane: what one sandbox, or one team, may hold of a data-plane worker ---------
# Every blocking call (a file, an agent request, a stream's reader) runs on one of a
# worker's DATAPLANE_THREADS threads. One sandbox holds at most DATAPLANE_SANDBOX_THREADS of
# them at once and one team at most DATAPLANE_TEAM_THREADS: a wedged agent (its guest
# stopped it: each call then waits out the agent's 30 s open timeout), a flood of uploads or
# of followed commands costs that sandbox (that team) its own share, never the others'. A
# call past its share waits DATAPLANE_ADMIT_SECONDS for a thread of it, then is answered
# 429 (resource_exhausted), as a rate limit is. Per worker (``serve`` runs several).
DATAPLANE_THREADS = _positive_int("DATAPLANE_THREADS", 512)
DATAPLANE_SANDBOX_THREADS = _positive_int("DATAPLANE_SANDBOX_THREADS", 64)
DATAPLANE_TEAM_THREADS = _positive_int("DATAPLANE_TEAM_THREADS", 192)
DATAPLANE_ADMIT_SECONDS = _seconds("DATAPLANE_ADMIT_SECONDS", 10.0)
# A ``/files`` body that moves less than 64 KiB in DATAPLANE_BODY_IDLE_SECONDS (an upload
# the client stopped sending, a download the client stopped reading) ends: 408 for an
# upload, a cut connection for a download; its thread and file are freed. envd's own
# server has no such bound; E2B's proxy cuts idle connections after minutes, which would
# let one client hold a thread per connection for as long.
DATAPLANE_BODY_IDLE_SECONDS = _seconds("DATAPLANE_BODY_IDLE_SECONDS", 30.0)

# --- idempotency -----------------------------------------------------------------------
IDEMPOTENCY_TTL_SECONDS = _positive_int("IDEMPOTENCY_TTL_SECONDS", 86400)
IDEMPOTENCY_LEASE_SECONDS = _positive_int("IDEMPOTENCY_LEASE_SECONDS", 30)
# How long a request that finds its key in progress waits for the original to finish before
# answering 409 idempotency_in_progress (E2B answers at once; waiting lets retries converge).
IDEMPOTENCY_WAIT_SECONDS = _seconds("IDEMPOTENCY_WAIT_SECONDS", 5.0)
# Takeovers allowed before a key whose every attempt died answers 422 outcome unknown.
IDEMPOTENCY_MAX_ATTEMPTS = _positive_int("IDEMPOTENCY_MAX_ATTEMPTS", 5)
IDEMPOTENCY_ENCRYPTION_KEYS = env.list("IDEMPOTENCY_ENCRYPTION_KEYS", default=[])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "e2bfacade.observability.JsonFormatter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler"},
        "json": {"class": "logging.StreamHandler", "formatter": "json"},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        # One JSON line per request (e2bfacade.observability); on stderr, like the rest.
        "e2bfacade.request": {"handlers": ["json"], "level": "INFO", "propagate": False},
    },
}

# --- template builds (templates/builds) ----------------------------------------------
# Where uploaded COPY archives are kept, per team by the SDK's files hash.
TEMPLATE_FILES_DIR = Path(env.str("TEMPLATE_FILES_DIR", default=str(SANDBOX_ROOT / "build-files")))
TEMPLATE_FILE_MAX_MB = _positive_int("TEMPLATE_FILE_MAX_MB", 1024)
# All of one team's archives together (an upload past it is refused with a 413).
TEMPLATE_FILES_MAX_MB_PER_TEAM = _positive_int("TEMPLATE_FILES_MAX_MB_PER_TEAM", 10 * 1024)
# Archives no build in progress needs are removed this long after their upload.
TEMPLATE_FILES_KEEP_DAYS = _positive_int("TEMPLATE_FILES_KEEP_DAYS", 7)
# The caches under TEMPLATE_PULL_CACHE_DIR (pulled images' trees) and TEMPLATE_CACHE_DIR
# (the Debian bases' tarballs and images): an entry unused this long goes, and past the
# size the least recently used go first (never one used in the last hour, nor a current
# Debian recipe's). The worker's image sweep prunes them (templates/builds/caches.py).
TEMPLATE_PULL_CACHE_KEEP_DAYS = _positive_int("TEMPLATE_PULL_CACHE_KEEP_DAYS", 14)
TEMPLATE_PULL_CACHE_MAX_MB = _positive_int("TEMPLATE_PULL_CACHE_MAX_MB", 20 * 1024)
TEMPLATE_BASES_CACHE_KEEP_DAYS = _positive_int("TEMPLATE_BASES_CACHE_KEEP_DAYS", 30)
TEMPLATE_BASES_CACHE_MAX_MB = _positive_int("TEMPLATE_BASES_CACHE_MAX_MB", 4 * 1024)
# The system templates' finished images (code-interpreter-v1), kept by the digest of their
# inputs outside any sandbox root, so a new root or a host that lost its images restores
# one in seconds instead of building it (templates/builds/image_cache.py). Pruned as above.
TEMPLATE_IMAGE_CACHE_DIR = Path(
    env.str("TEMPLATE_IMAGE_CACHE_DIR", default=str(TEMPLATE_CACHE_DIR / "images"))
)
if not TEMPLATE_IMAGE_CACHE_DIR.is_absolute():
    raise ImproperlyConfigured(
        f"TEMPLATE_IMAGE_CACHE_DIR must be an absolute path, got {str(TEMPLATE_IMAGE_CACHE_DIR)!r}"
    )
TEMPLATE_IMAGE_CACHE_KEEP_DAYS = _positive_int("TEMPLATE_IMAGE_CACHE_KEEP_DAYS", 30)
TEMPLATE_IMAGE_CACHE_MAX_MB = _positive_int("TEMPLATE_IMAGE_CACHE_MAX_MB", 8 * 1024)
# How long an upload URL handed to the SDK stays valid (E2B: 30 minutes).
TEMPLATE_UPLOAD_URL_SECONDS = _positive_int("TEMPLATE_UPLOAD_URL_SECONDS", 1800)
# An upload's whole body must arrive within this (and 64 KiB of it within every
# DATAPLANE_BODY_IDLE_SECONDS), or it is cut with a 408 and leaves nothing. The SDKs give an
# upload an hour.
TEMPLATE_UPLOAD_SECONDS = _positive_int("TEMPLATE_UPLOAD_SECONDS", 3600)
# Uploads streaming at once: per team, and for the service (count and declared bytes). What
# an upload declares is reserved before its first byte is read; past a bound it is refused
# (429 for the team's count, 503 with Retry-After for the service's) without reading it.
TEMPLATE_UPLOADS_PER_TEAM = _positive_int("TEMPLATE_UPLOADS_PER_TEAM", 8)
TEMPLATE_UPLOADS_IN_FLIGHT = _positive_int("TEMPLATE_UPLOADS_IN_FLIGHT", 64)
TEMPLATE_UPLOADS_IN_FLIGHT_MB = _positive_int("TEMPLATE_UPLOADS_IN_FLIGHT_MB", 8192)
# The base of the upload URLs (what clients reach this API at); empty: the request's own.
E2B_PUBLIC_API_URL = env.str("E2B_PUBLIC_API_URL", default="").rstrip("/")
# Workload identity (sandboxes/identity/): how long a minted token is valid, and how often
# the issuer's signing key is replaced (a replaced key stays in the JWKS one more period).
IDENTITY_TOKEN_SECONDS = _int("IDENTITY_TOKEN_SECONDS", 300, 30, 3600, "between 30 and 3600")
IDENTITY_KEY_ROTATION_DAYS = _int("IDENTITY_KEY_ROTATION_DAYS", 30, 1, 365, "between 1 and 365")
# Builds of one team in waiting or building at once (E2B answers 429 past its limit).
TEMPLATE_BUILDS_PER_TEAM = _int("TEMPLATE_BUILDS_PER_TEAM", 4, 1, 64, "between 1 and 64")
# Builds one build worker runs at once (each in a sandbox of its own). Two, so that with one
# build per team running (below) one team never holds every worker of a host.
TEMPLATE_BUILD_CONCURRENCY = _int("TEMPLATE_BUILD_CONCURRENCY", 2, 0, 16, "between 0 and 16")
# Builds of one team running at once, on all hosts together (its others wait their turn).
TEMPLATE_BUILDS_RUNNING_PER_TEAM = _int(
    "TEMPLATE_BUILDS_RUNNING_PER_TEAM", 1, 1, 64, "between 1 and 64"
)
# A build worker's hold on a build; renewed while it runs, taken over once it runs out.
TEMPLATE_BUILD_LEASE_SECONDS = _positive_int("TEMPLATE_BUILD_LEASE_SECONDS", 30)
# A whole build's limit, from its first claim (queueing is not counted), and one RUN
# step's (E2B: 1 h per command).
TEMPLATE_BUILD_TIMEOUT_SECONDS = _positive_int("TEMPLATE_BUILD_TIMEOUT_SECONDS", 3600)
TEMPLATE_STEP_TIMEOUT_SECONDS = _positive_int("TEMPLATE_STEP_TIMEOUT_SECONDS", 3600)
# How many log entries a build keeps (the rest are counted in one last entry).
TEMPLATE_BUILD_LOG_ENTRIES = _positive_int("TEMPLATE_BUILD_LOG_ENTRIES", 10000)
# Whether RUN steps reach the internet (through the runtime's NAT and SANDBOX_BLOCKED_CIDRS,
# as any sandbox's traffic does).
TEMPLATE_BUILD_INTERNET = env.bool("TEMPLATE_BUILD_INTERNET", default=True)
