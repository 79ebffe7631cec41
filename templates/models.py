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
        """:meth:`resolve`, with the candidates' rows locked in primary-key order (at most
        the team's alias and a public one; the same order for every create, so concurrent
        creates lock them alike): a create's reserve, on every create. Plain SQL: through
        the ORM, compiling this query cost more than running it (1.2 ms against 0.55 ms,
        measured on PostgreSQL)."""
        qn = connection.ops.quote_name
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        candidates = self.raw(
            f"SELECT * FROM {qn(self.model._meta.db_table)} "
            "WHERE (team_id IS NULL OR team_id = %s) AND (template_id = %s OR alias = %s) "
            f"ORDER BY template_id{lock}",
            [team_id, ref, ref],
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
    # runtime's warm pool). Null: SANDBOX_WARM_POOL for a template with a start command,
    # none for another.
    warm_pool = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(16)],
        help_text=(
            "Started sandboxes kept ready for creates to take (at most 16). Empty: "
            "SANDBOX_WARM_POOL for a template with a start command, none for another."
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
        # One immutable build per template: a stable UUID derived from the id.
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"e2bfacade:template:{self.template_id}"))

    @property
    def names(self) -> list[str]:
        return [self.alias] if self.alias else []
