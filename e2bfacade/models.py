"""Teams, their API keys and their access tokens: every resource belongs to exactly one team.

An API key drives sandboxes and templates (``X-API-Key``). An access token
(``Authorization: Bearer``) manages the team's keys and tokens, which an API key never may:
a leaked key cannot mint more. Both are stored as a hash and the few characters E2B shows of
them (:class:`Mask`); the raw value exists only in the response that made it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, models, transaction
from django.db.models import Q

# New keys are ``e2b_`` + 40 lowercase hex digits (160 random bits): E2B SDKs from about 2.25
# to 2.4x refuse, client-side, any key not matching ``^e2b_[0-9a-f]+$``. Keys of any other
# format minted before still authenticate: a key is looked up by its hash, whatever its text.
API_KEY_PREFIX = "e2b_"
API_KEY_HEX_DIGITS = 40
# Access tokens as E2B mints them: ``sk_e2b_`` + 40 lowercase hex digits.
ACCESS_TOKEN_PREFIX = "sk_e2b_"
# How stale ``lastUsed`` may be: a key's use is written at most once per this interval, so
# authentication does not turn every request into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class Mask:
    """What E2B shows of a secret (its ``IdentifierMaskingDetails``): the type prefix, the
    length of the value after it, its first two and last four characters."""

    prefix: str
    value_length: int
    masked_prefix: str
    masked_suffix: str

    @classmethod
    def of(cls, raw: str, prefix: str) -> Mask:
        value = raw[len(prefix) :] if raw.startswith(prefix) else raw
        prefix = prefix if raw.startswith(prefix) else ""
        # Never more than the value minus its suffix: a mask must not spell out the secret.
        head = min(2, max(len(value) - 4, 0))
        return cls(prefix, len(value), value[:head], value[-4:] if len(value) > 4 else "")

    def wire(self) -> dict[str, object]:
        return {
            "prefix": self.prefix,
            "valueLength": self.value_length,
            "maskedValuePrefix": self.masked_prefix,
            "maskedValueSuffix": self.masked_suffix,
        }


def hash_api_key(raw: str) -> str:
    # Keys are 160 random bits: a plain SHA-256 is enough (no dictionary to defend against),
    # and it lets authentication look the key up by an indexed equality.
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


SYSTEM_TEAM_NAME = "e2bfacade-system"


class TeamQuerySet(models.QuerySet["Team"]):
    def by_wire_id(self, value: str) -> Team | None:
        """The team E2B's ``teamID`` names (its number, as ``GET /teams`` answers it); None
        for anything else, a malformed id included (never a database error)."""
        if not value.isascii() or not value.isdigit() or len(value) > 18:
            return None
        return self.filter(pk=int(value)).first()


class Team(models.Model):
    name = models.CharField(max_length=255)
    # The service's own team (at most one): it owns the builds of the public templates the
    # service makes (code-interpreter-v1). No API key authenticates as it, so no caller sees,
    # tags, rebuilds or deletes what it owns through the API.
    system = models.BooleanField(default=False, db_default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name"], name="team_name_unique"),
            models.UniqueConstraint(
                fields=["system"], condition=Q(system=True), name="team_one_system"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class SystemTeamTaken(Exception):
    """A team that is not the service's holds the system team's name."""


def system_team() -> Team:
    """The system team, made on first use. Insert-then-catch: concurrent first uses end
    with one (``team_one_system``)."""
    team = Team.objects.filter(system=True).first()
    if team is not None:
        return team
    try:
        with transaction.atomic():  # a savepoint: a caller's transaction survives the loss
            return Team.objects.create(name=SYSTEM_TEAM_NAME, system=True)
    except IntegrityError:
        team = Team.objects.filter(system=True).first()
        if team is None:  # the name is another team's
            raise SystemTeamTaken(
                f"a team named {SYSTEM_TEAM_NAME!r} exists and is not the service's own; rename it"
            ) from None
        return team


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def resolve(self, raw: str) -> ApiKey | None:
        """The live key for ``raw``, compared in constant time after the indexed lookup."""
        digest = hash_api_key(raw)
        # A key of the system team (none is ever made, see api_key_create) never resolves.
        key = (
            self.select_related("team")
            .filter(key_hash=digest, revoked_at__isnull=True, team__system=False)
            .first()
        )
        if key is None or not hmac.compare_digest(key.key_hash, digest):
            return None
        return key


class ApiKey(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_keys")
    # The id E2B's routes name a key by (``/api-keys/{apiKeyID}``, a UUID).
    public_id = models.UUIDField(default=uuid.uuid4, editable=False, unique=True)
    name = models.CharField(max_length=255, blank=True)
    key_hash = models.CharField(max_length=64, editable=False)
    # The first characters, so an operator can tell keys apart without the secret.
    prefix = models.CharField(max_length=16, editable=False)
    # The rest of E2B's mask (see Mask). Keys minted before these were kept have an empty
    # suffix: their last characters were never stored.
    value_length = models.PositiveSmallIntegerField(default=0, editable=False)
    masked_suffix = models.CharField(max_length=4, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key_hash"], name="apikey_hash_unique")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.team})"

    @property
    def mask(self) -> Mask:
        has_prefix = self.prefix.startswith(API_KEY_PREFIX)
        value = self.prefix[len(API_KEY_PREFIX) :] if has_prefix else self.prefix
        return Mask(
            API_KEY_PREFIX if has_prefix else "",
            self.value_length,
            value[:2],
            self.masked_suffix,
        )


def api_key_create(*, team: Team, name: str = "") -> tuple[ApiKey, str]:
    """Create a key for ``team``; returns the row and the raw key, which is never stored.
    The system team has none: ValueError."""
    if team.system:
        raise ValueError("the system team has no API keys")
    raw = API_KEY_PREFIX + secrets.token_hex(API_KEY_HEX_DIGITS // 2)  # lowercase hex
    mask = Mask.of(raw, API_KEY_PREFIX)
    key = ApiKey.objects.create(
        team=team,
        name=name,
        key_hash=hash_api_key(raw),
        prefix=raw[:10],
        value_length=mask.value_length,
        masked_suffix=mask.masked_suffix,
    )
    return key, raw


class AccessTokenQuerySet(models.QuerySet["AccessToken"]):
    def resolve(self, raw: str) -> AccessToken | None:
        """The token for ``raw``, compared in constant time after the indexed lookup."""
        digest = hash_api_key(raw)
        token = self.select_related("team").filter(token_hash=digest).first()
        if token is None or not hmac.compare_digest(token.token_hash, digest):
            return None
        return token


class AccessToken(models.Model):
    """A team's credential for managing its API keys and access tokens (E2B's access
    token, ``Authorization: Bearer sk_e2b_…``). E2B binds one to a user who may belong to
    several teams; here there are no users, so a token is its team's, and ``X-Team-ID``,
    when sent, must name that team. Deleting one removes the row."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="access_tokens")
    name = models.CharField(max_length=255, blank=True)
    token_hash = models.CharField(max_length=64, editable=False)
    value_length = models.PositiveSmallIntegerField(editable=False)
    masked_prefix = models.CharField(max_length=2, editable=False)
    masked_suffix = models.CharField(max_length=4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AccessTokenQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token_hash"], name="accesstoken_hash_unique")
        ]

    def __str__(self) -> str:
        return f"{ACCESS_TOKEN_PREFIX}{self.masked_prefix}…{self.masked_suffix} ({self.team})"

    @property
    def mask(self) -> Mask:
        return Mask(ACCESS_TOKEN_PREFIX, self.value_length, self.masked_prefix, self.masked_suffix)


def access_token_mint(*, team: Team, name: str = "") -> tuple[AccessToken, str]:
    """Create an access token for ``team``; returns the row and the raw token, which is
    never stored (only its SHA-256, as for keys: 160 random bits need no slow hash)."""
    raw = ACCESS_TOKEN_PREFIX + secrets.token_hex(API_KEY_HEX_DIGITS // 2)
    mask = Mask.of(raw, ACCESS_TOKEN_PREFIX)
    token = AccessToken.objects.create(
        team=team,
        name=name,
        token_hash=hash_api_key(raw),
        value_length=mask.value_length,
        masked_prefix=mask.masked_prefix,
        masked_suffix=mask.masked_suffix,
    )
    return token, raw


class RateLimitWindow(models.Model):
    """Requests a team made in one fixed window (see e2bfacade/throttling.py). A row per
    (team, window start); old rows are deleted by the lifecycle worker."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    window_start = models.BigIntegerField()  # unix seconds
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "window_start"], name="ratelimit_team_window_unique"
            )
        ]

    def __str__(self) -> str:
        return f"team {self.team_id} @ {self.window_start}: {self.count}"
