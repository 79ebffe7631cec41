"""Snapshots are Template rows with ``kind = snapshot`` (E2B deletes them through
``DELETE /templates/{id}`` and starts sandboxes from their id). ``Snapshot`` is a proxy of
``Template`` so that the admin can give them a page of their own; it adds no table."""

from __future__ import annotations

from templates.models import Template


class Snapshot(Template):
    class Meta:
        proxy = True
        verbose_name = "snapshot"
        verbose_name_plural = "snapshots"
