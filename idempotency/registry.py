"""Routes opt into idempotency by registering an operation here (from their app's
``idempotent.py``, imported by the app's ready()).

An operation must be re-drivable from the record alone: ``execute`` is called with the
path parameters, the canonical body and the reserved resource id, by the original request,
by a retry that took over, or by the worker; every call for one resource id must converge
on the same single resource.
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
    # (team, params, body, resource_id) -> (status, JSON payload). Idempotent by id.
    execute: Callable[[Team, Params, Body, str], tuple[int, Any]]
    # Runs inside the claim transaction of a new key: makes the intent durable (e.g. the
    # sandbox row in state "creating"). May raise ApiError for a deterministic refusal, but
    # only before it writes anything: the refusal is stored in that same transaction.
    reserve: Callable[[Team, Params, Body, str], None] | None = None
    # The model whose primary key is the reserved resource id ("app_label.ModelName"), for
    # the admin's link from a record to its resource. A label, not the model: this app sits
    # below the apps that register operations and imports none of them. None: no link.
    resource_model: str | None = None


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
