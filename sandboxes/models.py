"""Sandboxes: the database is the source of truth for what a team owns and its state.

State machine (transitions are serialised by a row lock; no runtime call is made while the
lock is held — a transition is claimed in one short transaction, the runtime acts, and a
second short transaction records the outcome)::

    creating -> running <-> pausing -> paused -> resuming -> running
    any live state -> killing -> killed

On the wire only ``running`` and ``paused`` exist (the SDK crashes on anything else):
pausing/paused report ``paused``; creating/resuming/running report ``running``.
"""

from __future__ import annotations

import secrets
import string
import uuid
from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone

ID_ALPHABET = string.ascii_lowercase + string.digits
# E2B reports the client (edge node) id; this host is the one client.
CLIENT_ID = "e2bfacade"


def new_sandbox_id() -> str:
    # E2B's format: "i" + 20 of [a-z0-9].
    return "i" + "".join(secrets.choice(ID_ALPHABET) for _ in range(20))


def new_access_token() -> str:
    return secrets.token_urlsafe(24)


class SandboxQuerySet(models.QuerySet["Sandbox"]):
    def of_team(self, team_id: int) -> SandboxQuerySet:
        return self.filter(team_id=team_id)

    def on_host(self, host: str) -> SandboxQuerySet:
        """The rows ``host`` holds (and those made before rows recorded their host: the one
        host there was; the worker gives them their host when it starts)."""
        return self.filter(host__in=[host, ""])

    def live(self) -> SandboxQuerySet:
        """Visible to the API: everything that is not killed (and not still being born)."""
        return self.exclude(state__in=[Sandbox.State.KILLED, Sandbox.State.CREATING])

    def expired(self, now: datetime) -> SandboxQuerySet:
        return self.filter(state=Sandbox.State.RUNNING, end_at__lte=now)


class Sandbox(models.Model):
    class State(models.TextChoices):
        CREATING = "creating"
        RUNNING = "running"
        PAUSING = "pausing"
        PAUSED = "paused"
        RESUMING = "resuming"
        KILLING = "killing"
        KILLED = "killed"

    class OnTimeout(models.TextChoices):
        KILL = "kill"
        PAUSE = "pause"

    class PauseMode(models.TextChoices):
        FULL = "full"  # processes and memory kept
        FILESYSTEM = "filesystem"  # files only: a resume cold-boots it

    WIRE_STATE = {
        State.CREATING: "running",
        State.RUNNING: "running",
        State.RESUMING: "running",
        State.PAUSING: "paused",
        State.PAUSED: "paused",
        State.KILLING: "running",
        State.KILLED: "running",
    }

    sandbox_id = models.CharField(max_length=64, primary_key=True, default=new_sandbox_id)
    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="sandboxes")
    # No database constraint: a template may be deleted once no live sandbox uses it
    # (checked by template_delete), while killed sandboxes keep naming it for the record.
    template = models.ForeignKey(
        "templates.Template",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="sandboxes",
    )
    # The runtime image it started from when that is not the template's own: the build a
    # ``name:tag`` pointed at (empty: the template's image).
    image_id = models.CharField(max_length=64, blank=True, default="")
    # The templateID as the caller named it (alias or id), echoed back as ``alias``.
    alias = models.CharField(max_length=128, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CREATING)
    # When the current state was entered: lets the worker find transitions abandoned by a
    # process that died mid-way.
    state_changed_at = models.DateTimeField()
    started_at = models.DateTimeField()
    end_at = models.DateTimeField()
    killed_at = models.DateTimeField(null=True, blank=True)
    cpu_count = models.PositiveIntegerField()
    memory_mb = models.PositiveIntegerField()
    disk_size_mb = models.PositiveIntegerField()
    envd_version = models.CharField(max_length=32)
    envd_access_token = models.CharField(max_length=64, default=new_access_token)
    metadata = models.JSONField(default=dict, blank=True)
    env_vars = models.JSONField(default=dict, blank=True)
    on_timeout = models.CharField(max_length=8, choices=OnTimeout.choices, default=OnTimeout.KILL)
    # What a timeout's pause keeps (E2B's autoPauseMemory): memory too, or files only.
    auto_pause_memory = models.BooleanField(default=True)
    # What its latest pause kept; empty until it is first paused.
    pause_mode = models.CharField(max_length=16, choices=PauseMode.choices, blank=True)
    # Why it is in its state when nobody asked for it: its processes ended under it (a
    # crash: paused, files kept), or its files were lost (killed). Shown to its owner and in
    # the admin; empty for a state a caller asked for.
    state_reason = models.TextField(blank=True, default="")
    # The host (runtime root) that holds it: every runtime call about it is made there, and
    # no other host's worker touches it (:mod:`nodes.selectors` says which node that is).
    host = models.CharField(max_length=255, blank=True, default="")
    auto_resume = models.BooleanField(default=False)
    allow_internet_access = models.BooleanField(default=False)
    # Create's egress rules as given (allowOut, denyOut, dnsServers, maskRequestHost), kept
    # current by PUT /sandboxes/{id}/network.
    network = models.JSONField(default=dict, blank=True)
    # Demanded of callers of its ports (not envd's) when the create asked for
    # allowPublicTraffic false; empty: its ports are public.
    traffic_access_token = models.CharField(max_length=64, blank=True, default="")
    # The password of its egressProxy (network["egressProxy"] holds the address and user),
    # encrypted like a secret (e2bfacade.crypto); empty: none. Read by the egress proxy.
    egress_proxy_password = models.BinaryField(default=b"", blank=True)
    # E2B's iam (workload identity): {"issuer": URL, "tokens": {name: {audience,
    # tokenType}}}; empty: none. The egress proxy mints the tokens (sandboxes/identity/).
    iam = models.JSONField(default=dict, blank=True)

    objects = SandboxQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["team", "state", "started_at"], name="sandbox_team_state_idx"),
            models.Index(
                fields=["end_at"], name="sandbox_running_end_idx", condition=Q(state="running")
            ),
            models.Index(fields=["state", "state_changed_at"], name="sandbox_state_changed_idx"),
            # The list's order over the live states only (selectors.sandbox_list): a page is
            # read in index order and stops at its limit, however many sandboxes the team
            # has (0.2 ms instead of 8.7 ms for 100 of 10 000 on PostgreSQL).
            models.Index(
                fields=["team", "-started_at", "-sandbox_id"],
                name="sandbox_live_list_idx",
                condition=Q(state__in=["running", "resuming", "paused", "pausing"]),
            ),
        ]

    def __str__(self) -> str:
        return self.sandbox_id

    @property
    def wire_state(self) -> str:
        return self.WIRE_STATE[self.State(self.state)]


class Volume(models.Model):
    """A team's volume (E2B's volumes): storage on one host that outlives sandboxes and is
    mounted, live and shared, into the sandboxes that name it (``sandboxes/volumes/``). Its
    files are the runtime's (``e2bfacade.runtime.volumes``), under ``runtime_id``."""

    class State(models.TextChoices):
        CREATING = "creating"  # the row exists; the runtime's storage may not yet
        READY = "ready"
        DELETING = "deleting"  # being removed: no new mount, no content call

    volume_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CREATING)
    size_mb = models.PositiveIntegerField()
    # The host (runtime root) whose storage holds it: only that host mounts it.
    host = models.CharField(max_length=255, blank=True, default="")
    # Tokens name the epoch they were minted in; raising it revokes every earlier token.
    token_epoch = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the current state was entered: the worker finishes a create or a delete whose
    # process died mid-way once it has been still this long (sandboxes/volumes/services.py).
    state_changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="volume_team_name_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.volume_id})"

    @property
    def runtime_id(self) -> str:
        return str(self.volume_id)

    def live_mounts(self) -> models.QuerySet[SandboxVolumeMount]:
        """The mounts of this volume by sandboxes that are not killed (creating, running,
        paused and every transition between count: each may have it mounted)."""
        return SandboxVolumeMount.objects.filter(volume_id=self.volume_id).exclude(
            sandbox__state=Sandbox.State.KILLED
        )


class SandboxVolumeMount(models.Model):
    """A volume a sandbox mounts, at ``path`` in the guest: written with the sandbox's row
    (the same transaction), kept after its kill as the record of what it mounted. "Is this
    volume mounted by a live sandbox" is one query on the volume's index joined to the
    sandbox's primary key (``Volume.mounted_by_live``)."""

    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="volume_mounts")
    # RESTRICT rather than PROTECT: a volume cannot be deleted while a mount names it (its
    # delete removes the mounts of killed sandboxes first), yet deleting a team, which
    # cascades to both its sandboxes and its volumes, is not refused.
    volume = models.ForeignKey(Volume, on_delete=models.RESTRICT, related_name="mounts")
    path = models.CharField(max_length=4096)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["sandbox", "path"], name="sandbox_mount_path_unique")
        ]

    def __str__(self) -> str:
        return f"{self.volume_id} at {self.path} in {self.sandbox_id}"


class SandboxLogEntry(models.Model):
    """One entry of a sandbox's logs (E2B's ``SandboxLogEntry``): a lifecycle event the
    service recorded, or a line its template's start or ready command wrote while it booted.
    Bounded per sandbox (``SANDBOX_LOG_MAX_ENTRIES`` and ``_BYTES``, oldest first), kept
    ``SANDBOX_LOG_RETENTION_SECONDS`` after a kill (``sandboxes/logs.py``)."""

    class Level(models.TextChoices):
        DEBUG = "debug"
        INFO = "info"
        WARN = "warn"
        ERROR = "error"

    id = models.BigAutoField(primary_key=True)
    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="log_entries")
    timestamp = models.DateTimeField()
    level = models.CharField(max_length=8, choices=Level.choices)
    # Who wrote it: "lifecycle" (the service), "start" or "ready" (the template's commands).
    logger = models.CharField(max_length=32)
    message = models.TextField()
    fields = models.JSONField(default=dict, blank=True)
    size = models.PositiveIntegerField()  # the message's and fields' bytes: the byte bound's

    class Meta:
        indexes = [
            models.Index(fields=["sandbox", "timestamp", "id"], name="sandboxlog_order_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.sandbox_id} {self.timestamp:%Y-%m-%d %H:%M:%S} {self.level}"


class TeamMetricSample(models.Model):
    """A team's sandboxes over one step of ``TEAM_METRICS_STEP_SECONDS`` starting at ``at``
    (unix seconds): the most that were live at once, as sampled, and how many started.
    Written as the service runs (a start, the lifecycle worker's sample), read aggregated by
    GET /teams/{teamID}/metrics (``sandboxes/usage.py``); purged after
    ``TEAM_METRICS_RETENTION_SECONDS``."""

    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="+")
    at = models.BigIntegerField()
    concurrent = models.PositiveIntegerField(default=0)
    started = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "at"], name="teammetric_team_at_unique")
        ]

    def __str__(self) -> str:
        return f"team {self.team_id} @ {self.at}: {self.concurrent} live, {self.started} started"


def new_secret_id() -> str:
    return f"sec_{uuid.uuid4()}"  # E2B's: ``sec_`` + a UUID (the prefix names are denied)


class Secret(models.Model):
    """A team's secret (E2B's secrets, ``sandboxes/secrets/``): a name the egress proxy's
    transform rules name as ``${e2b.secrets.<name>}``, and its versions' values, which no
    read surface returns. Revoking sets ``revoked_at`` and erases every version's value in
    the same transaction: a revoked secret resolves to nothing, and its name is free again."""

    secret_id = models.CharField(primary_key=True, max_length=40, default=new_secret_id)
    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=128)  # canonical: lower-case
    current_version = models.PositiveIntegerField(default=1)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Live names only: a revoked secret's name may be taken again.
            models.UniqueConstraint(
                fields=["team", "name"],
                condition=Q(revoked_at__isnull=True),
                name="secret_team_live_name_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.secret_id})"


class SecretVersion(models.Model):
    """One value of a secret, encrypted (``e2bfacade.crypto``, so the key rotation covers
    it). Kept when a newer version is written; erased (empty) when the secret is revoked."""

    secret = models.ForeignKey(Secret, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    value_encrypted = models.BinaryField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["secret", "version"], name="secret_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.secret_id} v{self.version}"


class IdentityKey(models.Model):
    """A key the workload identity issuer signs tokens with (ES256, sandboxes/identity/):
    the newest signs; every key still listed (``retired_at`` unset) is in the JWKS. The
    private key is encrypted like a secret's value (``e2bfacade.crypto``)."""

    kid = models.CharField(primary_key=True, max_length=64)
    private_key_encrypted = models.BinaryField()
    created_at = models.DateTimeField()
    retired_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.kid
