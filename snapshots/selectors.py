"""The paged snapshot list."""

from __future__ import annotations

from django.db.models import Q

from e2bfacade.paging import make_token, read_token
from templates.models import Template

TOKEN_SALT = "e2bfacade.snapshot-list"


def snapshot_list(
    *, team_id: int, sandbox_id: str | None, name: str | None, limit: int, next_token: str | None
) -> tuple[list[Template], str | None]:
    """Newest first; keyset paging on (createdAt, snapshotID) with signed tokens."""
    qs = Template.objects.filter(team_id=team_id, kind=Template.Kind.SNAPSHOT)
    if sandbox_id:
        qs = qs.filter(source_sandbox_id=sandbox_id)
    if name:
        qs = qs.filter(alias=name)
    filters = [sandbox_id, name]
    if next_token:
        at, last = read_token(next_token, salt=TOKEN_SALT, filters=filters)
        qs = qs.filter(Q(created_at__lt=at) | Q(created_at=at, template_id__lt=last))
    rows = list(qs.order_by("-created_at", "-template_id")[: limit + 1])
    token = None
    if len(rows) > limit:
        rows = rows[:limit]
        token = make_token(
            salt=TOKEN_SALT, at=rows[-1].created_at, pk=rows[-1].template_id, filters=filters
        )
    return rows, token
