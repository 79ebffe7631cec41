"""Template reads that are more than a filter: the paged ``GET /v2/templates``."""

from __future__ import annotations

from django.db.models import Count, Max, Q, QuerySet

from e2bfacade.paging import make_token, read_token
from templates.models import Template

TOKEN_SALT = "e2bfacade.template-list"


def with_stats(qs: QuerySet[Template]) -> QuerySet[Template]:
    """``spawnCount`` and ``lastSpawnedAt`` in the list's one query."""
    return qs.annotate(spawn_count=Count("sandboxes"), last_spawned_at=Max("sandboxes__started_at"))


def template_list(*, team_id: int) -> QuerySet[Template]:
    """What ``GET /templates`` lists: the team's templates and the public ones (snapshots
    and forks are not templates here), oldest first."""
    qs = Template.objects.visible_to(team_id).filter(kind=Template.Kind.TEMPLATE)
    return with_stats(qs).order_by("created_at", "template_id")


def template_page(
    *, team_id: int, limit: int, next_token: str | None
) -> tuple[list[Template], str | None]:
    """:func:`template_list`, a page at a time: keyset paging on (createdAt, templateID)
    with signed tokens (e2bfacade.paging)."""
    qs = template_list(team_id=team_id)
    filters = [team_id]
    if next_token:
        at, last = read_token(next_token, salt=TOKEN_SALT, filters=filters)
        qs = qs.filter(Q(created_at__gt=at) | Q(created_at=at, template_id__gt=last))
    rows = list(qs[: limit + 1])
    token = None
    if len(rows) > limit:
        rows = rows[:limit]
        token = make_token(
            salt=TOKEN_SALT, at=rows[-1].created_at, pk=rows[-1].template_id, filters=filters
        )
    return rows, token
