"""Teams and their API keys: every resource belongs to exactly one team."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.db import IntegrityError, models, transaction
from django.db.models import Q

# New keys are ``e2b_`` + 40 lowercase hex digits (160 random bits): E2B SDKs from about 2.25
# to 2.4x refuse, client-side, any key not matching ``^e2b_[0-9a-f]+$``. Keys of any other
# format minted before still authenticate: a key is looked up by its hash, whatever its text.
API_KEY_PREFIX = "e2b_"
API_KEY_HEX_DIGITS = 40


def hash_api_key(raw: str) -> str:
    # Keys are 160 random bits: a plain SHA-256 is enough (no dictionary to defend against),
    # and it lets authentication look the key up by an indexed equality.
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


SYSTEM_TEAM_NAME = "e2bfacade-system"


class Team(models.Model):
    name = models.CharField(max_length=255)
    # The service's own team (at most one): it owns the builds of the public templates the
    # service makes (code-interpreter-v1). No API key authenticates as it, so no caller sees,
    # tags, rebuilds or deletes what it owns through the API.
    system = models.BooleanField(default=False, db_default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

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
    name = models.CharField(max_length=255, blank=True)
    key_hash = models.CharField(max_length=64, editable=False)
    # The first characters, so an operator can tell keys apart without the secret.
    prefix = models.CharField(max_length=16, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key_hash"], name="apikey_hash_unique")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.team})"


def api_key_create(*, team: Team, name: str = "") -> tuple[ApiKey, str]:
    """Create a key for ``team``; returns the row and the raw key, which is never stored.
    The system team has none: ValueError."""
    if team.system:
        raise ValueError("the system team has no API keys")
    raw = API_KEY_PREFIX + secrets.token_hex(API_KEY_HEX_DIGITS // 2)  # lowercase hex
    key = ApiKey.objects.create(team=team, name=name, key_hash=hash_api_key(raw), prefix=raw[:10])
    return key, raw


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
