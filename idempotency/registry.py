"""Routes opt into idempotency by registering an operation here (from their app's
``idempotent.py``, imported by the app's ready()).

An operation must be re-drivable from the record alone: ``execute`` is called with the
path parameters, the canonical body and the reserved resource id, by the original request,
by a retry that took over, or by the worker; every call for one resource id must converge
on the same single resource. The original request also hands ``execute`` what its own
``reserve`` returned (the committed row it just wrote, so it need not be read back); every
re-drive gets None and reads what it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from e2bfacade.models import Team

Params = dict[str, str]
Body = dict[str, Any]


@dataclass(frozen=True)
class Operation:
    route: str
    new_resource_id: Callable[[], str]
    # (team, params, body, resource_id, reserved) -> (status, JSON payload). Idempotent by
    # id; ``reserved`` is this request's own reserve's return value, or None on a re-drive.
    execute: Callable[[Team, Params, Body, str, Any], tuple[int, Any]]
    # Runs inside the claim transaction of a new key: makes the intent durable (e.g. the
    # sandbox row in state "creating") and returns it. May raise ApiError for a
    # deterministic refusal, but only before it writes anything: the refusal is stored in
    # that same transaction.
    reserve: Callable[[Team, Params, Body, str], Any] | None = None
    # The model whose primary key is the reserved resource id ("app_label.ModelName"), for
    # the admin's link from a record to its resource. A label, not the model: this app sits
    # below the apps that register operations and imports none of them. None: no link.
    resource_model: str | None = None
    # (params, resource_id) -> whether this process may drive the resource: False when it
    # lives on another host sharing the database (that host's worker drives it). None: any.
    here: Callable[[Params, str], bool] | None = None
    # (resource_id) -> best-effort release of whatever an unfinished execute made, when no
    # one can re-drive it (a request without a key whose database went away mid-way);
    # returns whether nothing of it is left. None: nothing to release.
    undo: Callable[[str], bool] | None = None


_operations: dict[str, Operation] = {}


def register(operation: Operation) -> Operation:
    _operations[operation.route] = operation
    return operation


def get_operation(route: str) -> Operation:
    return _operations[route]


def find_operation(route: str) -> Operation | None:
    """The operation registered for ``route``, or None (a record left by a route since
    removed)."""
    return _operations.get(route)
