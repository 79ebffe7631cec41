"""Templates: the images sandboxes start from. Snapshots are templates too (E2B deletes a
snapshot through ``DELETE /templates/{id}`` and creates sandboxes from a snapshot id)."""

from __future__ import annotations

import secrets
import string
import uuid
from collections.abc import Callable

from django.core.validators import MaxValueValidator
from django.db import connection, models
from django.db.models import Q

ID_ALPHABET = string.ascii_lowercase + string.digits
ENVD_VERSION = "0.6.4"
DEFAULT_TAG = "default"


def new_template_id() -> str:
    # E2B's template ids are 20 characters of [a-z0-9].
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(20))


class TemplateQuerySet(models.QuerySet["Template"]):
    def visible_to(self, team_id: int) -> TemplateQuerySet:
        """Public templates and the team's own."""
        return self.filter(Q(team__isnull=True) | Q(team_id=team_id))

    def resolve(self, team_id: int, ref: str) -> Template | None:
        """A template by id or alias, as E2B's ``templateID`` accepts both. A team's own
        alias wins over a public one of the same name."""
        candidates = self.visible_to(team_id).filter(Q(template_id=ref) | Q(alias=ref))
        return min(candidates, key=_preference(ref), default=None)

    def resolve_locked(self, team_id: int, ref: str) -> Template | None:
        """What a sandbox create may start: :meth:`resolve`, and another team's published
        template by its id (never by alias: aliases are unique per team only, so one would
        be ambiguous across teams). The candidates' rows are locked in primary-key order (at
        most the team's alias and a public one; the same order for every create, so
        concurrent creates lock them alike): a create's reserve, on every create. Plain
        SQL: through the ORM, compiling this query cost more than running it (1.2 ms
        against 0.55 ms, measured on PostgreSQL)."""
        qn = connection.ops.quote_name
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        candidates = self.raw(
            f"SELECT * FROM {qn(self.model._meta.db_table)} "
            "WHERE ((team_id IS NULL OR team_id = %s) AND (template_id = %s OR alias = %s)) "
            "OR (public AND kind = %s AND template_id = %s) "
            f"ORDER BY template_id{lock}",
            [team_id, ref, ref, Template.Kind.TEMPLATE.value, ref],
        )
        return min(candidates, key=_preference(ref), default=None)


def _preference(ref: str) -> Callable[[Template], tuple[bool, bool]]:
    """Among the templates ``ref`` names: its id first, then a team's own alias."""
    return lambda t: (t.template_id != ref, t.team_id is None)


class Template(models.Model):
    class Kind(models.TextChoices):
        TEMPLATE = "template"
        SNAPSHOT = "snapshot"
        # The hidden image a fork starts from; removed by the worker once no fork uses it.
        FORK = "fork"

    template_id = models.CharField(max_length=64, primary_key=True, default=new_template_id)
    # Null team: a public template every team may use (the built-in ``base``, imports).
    team = models.ForeignKey(
        "e2bfacade.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="templates"
    )
    # Published (``e2b template publish``): other teams may start it by its id, never build
    # on, tag or delete it. A team-less template is public whatever this says.
    public = models.BooleanField(default=False)
    # NULL, not "": an unnamed template must not collide with another under the unique alias.
    alias = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TEMPLATE)
    # The runtime image this template starts from (see e2bfacade.runtime).
    image_id = models.CharField(max_length=64)
    cpu_count = models.PositiveIntegerField(default=2)
    memory_mb = models.PositiveIntegerField(default=512)
    disk_size_mb = models.PositiveIntegerField(default=1024)
    pids_max = models.PositiveIntegerField(default=1024)
    # Started sandboxes of this template the host keeps ready for creates to take (the
    # runtime's warm pool). Null: SANDBOX_WARM_POOL for a public template with a start
    # command, none for another.
    warm_pool = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(16)],
        help_text=(
            "Started sandboxes kept ready for creates to take (at most 16). Empty: "
            "SANDBOX_WARM_POOL for a public template with a start command, none for another."
        ),
    )
    envd_version = models.CharField(max_length=32, default=ENVD_VERSION)
    size_bytes = models.BigIntegerField(default=0)
    # Snapshots and forks: the sandbox they were taken from.
    source_sandbox_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TemplateQuerySet.as_manager()

    class Meta:
        constraints = [
            # An alias names one template per owner; public aliases are unique among public.
            models.UniqueConstraint(
                fields=["team", "alias"],
                name="template_team_alias_unique",
                condition=Q(team__isnull=False) & Q(alias__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["alias"],
                name="template_public_alias_unique",
                condition=Q(team__isnull=True) & Q(alias__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.alias or self.template_id

    @property
    def build_id(self) -> str:
        """The build its ``default`` tag points at; for a template that was never built
        here (imports, snapshots, ``base``) a stable UUID derived from its id."""
        tag = self.tags.filter(tag=DEFAULT_TAG).values_list("build_id", flat=True).first()
        if tag is not None:
            return str(tag)
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"e2bfacade:template:{self.template_id}"))

    @property
    def is_public(self) -> bool:
        return self.team_id is None or self.public

    @property
    def names(self) -> list[str]:
        return [self.alias] if self.alias else []


# ------------------------------------------------------------------------------- builds
# The disk of a build's sandbox (its steps write there; each capture is at most this).
BUILD_DISK_MB = 4096


class BuildStatus(models.TextChoices):
    """The statuses E2B's wire knows; nothing else is ever stored or answered."""

    WAITING = "waiting"
    BUILDING = "building"
    READY = "ready"
    ERROR = "error"


class TemplateBuild(models.Model):
    """One build of a template (``POST /v3/templates`` makes it ``waiting``; the trigger
    stores its steps and makes it ``building``; a build worker holding its lease finishes
    it ``ready``, with the image, or ``error``, with a reason)."""

    build_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="builds")
    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=BuildStatus.choices)
    cpu_count = models.PositiveIntegerField(default=2)
    memory_mb = models.PositiveIntegerField(default=1024)
    # The tags the request asked for: assigned when the build becomes ready.
    tags = models.JSONField(default=list)
    # The trigger's body (from, steps, start and ready commands, force) and its digest:
    # a replayed trigger with the same body is answered 202 again.
    spec = models.JSONField(null=True, blank=True)
    spec_digest = models.CharField(max_length=64, blank=True, default="")
    # {"message", "step"?} once the build is ``error``.
    reason = models.JSONField(null=True, blank=True)
    image_id = models.CharField(max_length=64, blank=True, default="")
    # The context (user, workdir, env) after its last step: where a build on it starts.
    context = models.JSONField(null=True, blank=True)
    # ``fromImageRegistry`` credentials, encrypted (e2bfacade.crypto), until the build ends.
    registry_auth = models.BinaryField(null=True, blank=True)
    # The build worker holding the build, until when (a crashed worker's lease runs out
    # and the next one re-drives the build from the layer cache).
    lease_owner = models.CharField(max_length=64, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # The host (runtime host id) whose API received the trigger: its COPY archives are in
    # that host's TEMPLATE_FILES_DIR, so only that host's build workers claim the build.
    # Empty: a build triggered before hosts were recorded (the one host there was).
    host = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Its first claim: where TEMPLATE_BUILD_TIMEOUT_SECONDS counts from (a re-drive keeps
    # it), and when its team was last served (the claim's fair share).
    running_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "lease_until"])]

    def __str__(self) -> str:
        return f"{self.template_id}/{self.build_id}"

    @property
    def sandbox_id(self) -> str:
        """The runtime id of the sandbox its steps run in (no ``sandboxes`` row has it)."""
        return f"b-{self.build_id.hex[:20]}"


class TemplateTag(models.Model):
    """A movable pointer from (template, tag) to a build; ``default`` is what a plain
    template name starts."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="tags")
    tag = models.CharField(max_length=128)
    build = models.ForeignKey(TemplateBuild, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["template", "tag"], name="template_tag_unique")
        ]

    def __str__(self) -> str:
        return f"{self.template_id}:{self.tag}"


class TagAssignment(models.Model):
    """Each time a tag was pointed at a build: the history ``/tags/{tag}/assignments``
    pages."""

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="+")
    tag = models.CharField(max_length=128)
    build = models.ForeignKey(TemplateBuild, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["template", "tag", "-id"])]

    def __str__(self) -> str:
        return f"{self.template_id}:{self.tag} -> {self.build_id}"


class BuildLogEntry(models.Model):
    """A build's log, as numbered entries: ``logsOffset`` counts them."""

    build = models.ForeignKey(TemplateBuild, on_delete=models.CASCADE, related_name="log")
    seq = models.PositiveIntegerField()
    timestamp = models.DateTimeField()
    level = models.CharField(max_length=8)
    step = models.CharField(max_length=16, blank=True, default="")
    message = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["build", "seq"], name="build_log_seq_unique")
        ]

    def __str__(self) -> str:
        return f"{self.build_id}#{self.seq}"


class BuildFile(models.Model):
    """A COPY step's uploaded archive, stored once per team by the SDK's files hash (so a
    team's templates share them). The bytes are under ``TEMPLATE_FILES_DIR``."""

    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="+")
    files_hash = models.CharField(max_length=128)
    size_bytes = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "files_hash"], name="build_file_unique")
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.files_hash}"


class UploadClaim(models.Model):
    """The one use of a signed upload URL, and what it reserves while its body streams in.

    The row is inserted before any body byte is read: its unique ``signature`` makes the
    URL single-use (a second PUT, concurrent or later, meets the constraint), and while it
    is ``IN_FLIGHT`` its ``size_bytes`` count against the team's archive quota and the
    service's in-flight bounds (templates/builds/files.py, ``upload_claim``). An in-flight
    row past its ``deadline`` reserves nothing: the process that streamed it died, since a
    live one ends every upload by then. Rows go once their URL has expired (the signature
    then refuses it anyway)."""

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        STORED = "stored"
        FAILED = "failed"

    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="+")
    files_hash = models.CharField(max_length=64)
    signature = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_FLIGHT)
    deadline = models.DateTimeField()
    url_expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["signature"], name="upload_claim_single_use")
        ]
        indexes = [models.Index(fields=["state", "deadline"], name="upload_claim_in_flight")]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.files_hash} ({self.state})"


class LayerCacheEntry(models.Model):
    """A build step's result, keyed by E2B's hash chain within a team: the image after the
    step and the context (user, workdir, env) the next step starts from."""

    team = models.ForeignKey("e2bfacade.Team", on_delete=models.CASCADE, related_name="+")
    # The template whose build made it: its layers go with it.
    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="+")
    layer_hash = models.CharField(max_length=64)
    image_id = models.CharField(max_length=64)
    context = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "layer_hash"], name="layer_cache_unique")
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.layer_hash}"
