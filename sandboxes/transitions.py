"""The sandbox state machine, declared once, and the claim / act / finish machinery every
state change goes through (docs/ARCHITECTURE.md, "Claim, act, finish").

A transition is **claimed** in one short transaction under the row lock
(``select_for_update``): the row moves to a transitional state. The runtime then **acts**
with no lock and no transaction held. A second short transaction **finishes** it, fenced
on the transitional state claimed, so a finish never overwrites a state someone else
recorded meanwhile. A process that dies between the two leaves the row transitional with
``state_changed_at`` set; the lifecycle worker finishes it (:mod:`sandboxes.worker`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from e2bfacade.errors import ApiError, BadRequest, Conflict, NotFound, ServiceUnavailable
from e2bfacade.models import Team
from e2bfacade.runtime.base import (
    CreateRefused,
    LimitExceeded,
    PauseMode,
    RuntimeConflict,
    RuntimeUnavailable,
    SandboxNotFound,
    SandboxRuntimeError,
)
from nodes.selectors import local_node, node_for_sandbox
from sandboxes.models import Sandbox

logger = logging.getLogger(__name__)

State = Sandbox.State
LIVE_STATES = [State.RUNNING, State.PAUSING, State.PAUSED, State.RESUMING]
TRANSITIONAL_STATES = [State.CREATING, State.PAUSING, State.RESUMING, State.KILLING]
LIVE_OR_KILLING = frozenset([*LIVE_STATES, State.KILLING])
# How long a caller waits for another caller's transition on the same sandbox to finish
# before answering 409 (E2B's connect waits too). Transitions take milliseconds.
TRANSITION_WAIT_SECONDS = 5.0

# The state machine: every state a row may move to from each state. Nothing writes a
# state change that is not in this table (``transition_finish`` and the claims check).
MOVES: dict[str, frozenset[str]] = {
    # created by sandbox_reserve; a refused create deletes the row instead
    State.CREATING: frozenset({State.RUNNING, State.KILLING}),
    # running -> killed: the reconciler found the runtime had lost it
    State.RUNNING: frozenset({State.RUNNING, State.PAUSING, State.KILLING, State.KILLED}),
    State.PAUSING: frozenset({State.PAUSED, State.RUNNING, State.KILLING, State.KILLED}),
    State.PAUSED: frozenset({State.RESUMING, State.KILLING, State.KILLED}),
    State.RESUMING: frozenset({State.RUNNING, State.PAUSED, State.KILLING, State.KILLED}),
    State.KILLING: frozenset({State.KILLING, State.KILLED}),  # a retried kill re-drives
    State.KILLED: frozenset(),
}


@dataclass(frozen=True)
class Transition:
    """One API operation on a live sandbox: the states it starts from (each mapped to the
    transitional state it claims), the states that answer 409 at once (with the message,
    ``{id}`` filled in), and any other live state is waited out."""

    name: str
    claims: dict[str, str]
    conflicts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for source, target in self.claims.items():
            assert target in MOVES[source], f"{self.name}: {source} -> {target} is not a move"


PAUSE = Transition(
    "pause",
    claims={State.RUNNING: State.PAUSING},
    conflicts={
        State.PAUSED: "sandbox {id} is already paused",
        State.PAUSING: "sandbox {id} is already being paused",
    },
)
RESUME = Transition(
    "resume",
    claims={State.PAUSED: State.RESUMING},
    conflicts={
        State.RUNNING: "sandbox {id} is already running",
        State.RESUMING: "sandbox {id} is already being resumed",
    },
)
# running -> running is a no-op claim that still takes the row lock.
CONNECT = Transition("connect", claims={State.RUNNING: State.RUNNING, State.PAUSED: State.RESUMING})
# A kill claims every state a row is killed from, a kill in flight included (a retried kill
# re-drives it), and a row still being created (its create then finds it killed).
KILL = Transition(
    "kill",
    claims={
        s: State.KILLING
        for s in (
            State.CREATING,
            State.RUNNING,
            State.PAUSING,
            State.PAUSED,
            State.RESUMING,
            State.KILLING,
        )
    },
)
# What a timeout does to a running sandbox (the lifecycle worker's, sandboxes.worker).
TIMEOUT_KILL = Transition("timeout kill", claims={State.RUNNING: State.KILLING})
TIMEOUT_PAUSE = Transition("timeout pause", claims={State.RUNNING: State.PAUSING})


def not_found(sandbox_id: str) -> NotFound:
    return NotFound(f"Sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")


def runtime_error(exc: Exception) -> ApiError:
    """A runtime failure as an API error with a message a human can act on."""
    if isinstance(exc, RuntimeUnavailable):
        # Permanent for this host: tell the SDK not to retry.
        return ServiceUnavailable(exc.message, headers={"Should-Retry": "false"})
    if isinstance(exc, RuntimeConflict):
        return Conflict(exc.message)
    if isinstance(exc, LimitExceeded):
        return BadRequest(exc.message)
    if isinstance(exc, CreateRefused):
        return ServiceUnavailable(f"the sandbox runtime refused: {exc.message}")
    return ServiceUnavailable(f"sandbox runtime error: {exc}")


def transition_claim(
    *, team: Team, sandbox_id: str, transition: Transition, wait: bool = True
) -> tuple[Sandbox, str]:
    """Lock the sandbox and move it as ``transition`` claims. Returns the row (before the
    change) and its previous state. A conflicting state answers 409 at once; another live
    transitional state is waited out for up to :data:`TRANSITION_WAIT_SECONDS`, then 409.
    """
    deadline = time.monotonic() + (TRANSITION_WAIT_SECONDS if wait else 0)
    here = local_node()  # the runtime is built, if need be, outside the transaction
    while True:
        now = timezone.now()
        with transaction.atomic():
            # The row lock serialises transitions of one sandbox across every worker and
            # replica; it is held only for this check-and-set, never across a runtime call.
            row = (
                Sandbox.objects.select_for_update()
                .of_team(team.pk)
                .filter(pk=sandbox_id)
                .exclude(state=State.KILLED)
                .first()
            )
            # A row still being created is no one's yet, but a kill's.
            if row is None or (
                row.state == State.CREATING and State.CREATING not in transition.claims
            ):
                raise not_found(sandbox_id)
            node_for_sandbox(row, local=here)  # 503 for a row another host holds
            previous = row.state
            if previous in transition.claims:
                return row, transition_claim_locked(row, transition, now)
            if previous == State.KILLING:
                raise Conflict(f"sandbox {sandbox_id} is being killed")
            if previous in transition.conflicts:
                raise Conflict(transition.conflicts[previous].format(id=sandbox_id))
        if time.monotonic() >= deadline:
            raise Conflict(f"sandbox {sandbox_id} is {previous}; try again shortly")
        time.sleep(0.02)


def paused_fields(mode: PauseMode | None, reason: str | None = None) -> dict[str, object]:
    """The row's fields for a pause that kept ``mode`` (None: the runtime did not say, as
    a freeze), and why when nobody asked for it."""
    return {"pause_mode": str(mode or PauseMode.FULL), "state_reason": reason or ""}


def transition_claim_locked(row: Sandbox, transition: Transition, now: datetime) -> str:
    """Move ``row``, which the caller has locked (``select_for_update``) in its transaction,
    as ``transition`` claims from its state; returns that previous state."""
    previous = row.state
    row.state = transition.claims[previous]
    row.state_changed_at = now
    row.save(update_fields=["state", "state_changed_at"])
    return previous


def transition_finish(
    sandbox: Sandbox, from_state: str, to_state: str, **fields: object
) -> Sandbox:
    """Record a transition's outcome, fenced on the transitional state we claimed."""
    assert to_state in MOVES[from_state], f"{from_state} -> {to_state} is not a move"
    now = timezone.now()
    updated = Sandbox.objects.filter(pk=sandbox.pk, state=from_state).update(
        state=to_state, state_changed_at=now, **fields
    )
    sandbox.refresh_from_db()
    if not updated:
        logger.warning("sandbox %s left %s before we finished", sandbox.pk, from_state)
    return sandbox


def transition_act(
    sandbox: Sandbox,
    claimed: str,
    rollback_to: str,
    fn: Callable[..., object],
    *args: object,
    **kwargs: object,
) -> None:
    """Run a runtime operation for a claimed transition; on failure restore the previous
    state (the runtime's operations are all-or-nothing) and raise an API error."""
    try:
        fn(*args, **kwargs)
    except SandboxNotFound as exc:
        # It died under us: record that and answer as E2B does for a missing sandbox.
        transition_finish(sandbox, claimed, State.KILLED, killed_at=timezone.now())
        raise not_found(sandbox.sandbox_id) from exc
    except (SandboxRuntimeError, OSError) as exc:
        transition_finish(sandbox, claimed, rollback_to)
        raise runtime_error(exc) from exc
