"""Admission: a sandbox is created only if its host can hold it and its team may have it.

Checked in the create's reserve transaction, before the sandbox row exists:

- **Per sandbox**, against what the driver says its host has (``Runtime.capacity`` of the
  node the create is placed on, read through the nodes seam, :mod:`nodes.selectors`): no
  more CPUs than the host has, no more memory or pids than all sandboxes together may
  use. Deterministic: a 400, stored and replayed under an Idempotency-Key.
- **Per team**: at most ``SANDBOX_MAX_CONCURRENT_PER_TEAM`` sandboxes that are not killed.
  The team's row is locked for the count, so concurrent creates across every worker
  admit exactly up to the limit. 429, as E2B answers; the key is released.
- **Per host**: the memory and disk this host's live sandboxes were given (a sandbox
  paused with its files only holds no memory; on a driver whose pause checkpoints memory to
  disk, gvisor, a sandbox paused with its memory holds none either, and its memory counts
  as disk instead: its checkpoint takes up to that much), plus this one, within the host's capacity
  times ``SANDBOX_MEMORY_OVERCOMMIT`` / ``SANDBOX_DISK_OVERCOMMIT`` (limits are caps,
  rarely all used at once); other hosts' sandboxes on the same database are theirs. The
  disk counted also holds the size of each of this host's volumes (creating, ready or
  deleting: each is an image of up to that size on the host's disk), and each template
  build this host is running holds its build sandbox's memory and disk (a build sandbox has
  no ``sandboxes`` row, but it is a sandbox on the host all the same). 503 with
  Retry-After; the key is released.

A volume's create is admitted against the same disk bound (:func:`volume_admit`): the
live sandboxes' disks, the host's volumes and the new one together. A 400 that releases
the key, as the team's volume budget answers.
  Concurrent creates of different teams may overshoot this soft bound by their number;
  the hard bound is the driver's cap on all sandboxes together (a memory cgroup over
  them all), which no mix of guests can pass.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from e2bfacade import capabilities
from e2bfacade.errors import AtCapacity, BadRequest, NothingAllocated
from e2bfacade.models import Team
from e2bfacade.runtime.base import Capability, Capacity, SandboxRuntimeError
from nodes import selectors
from nodes.selectors import Node
from sandboxes.models import Sandbox, Volume
from templates.models import BUILD_DISK_MB, Template, TemplateBuild
from templates.services import template_fits


def placement() -> tuple[Node, Capacity]:
    """The node a create is placed on (the first of :func:`nodes.selectors.placement_candidates`)
    and what it can give sandboxes, through the nodes seam: held in memory by the runtime
    once it is built (callers call this before they open a transaction, so that the first
    call of a process builds it there: no runtime work inside one)."""
    try:
        node = selectors.placement_candidates()[0]
        return node, selectors.node_capacity(node)
    except SandboxRuntimeError as exc:
        raise NothingAllocated(exc.message, headers={"Should-Retry": "false"}) from exc


def sandbox_admit(*, team: Team, template: Template) -> Node:
    """Admit one more sandbox of ``template`` for ``team`` on the node :func:`placement`
    chooses, or raise; returns the node. Caller holds a transaction, which the team's row
    lock lasts for."""
    node, cap = placement()
    host = node.host_id
    template_fits(
        cap,
        name=str(template),
        cpu_count=template.cpu_count,
        memory_mb=template.memory_mb,
        pids_max=template.pids_max,
        disk_size_mb=template.disk_size_mb,
    )
    team_live, memory_used, disk_used, volumes_mb = _usage(team.pk, host)
    limit = settings.SANDBOX_MAX_CONCURRENT_PER_TEAM
    if limit and team_live >= limit:
        raise AtCapacity(
            f"You have reached the maximum number of concurrent sandboxes ({limit}) for this "
            "team. Kill a sandbox, or ask the operator to raise "
            "SANDBOX_MAX_CONCURRENT_PER_TEAM.",
            headers={"Retry-After": "5"},
        )
    for what, in_use, asked, total, ratio, holders in (
        (
            "memory",
            memory_used,
            template.memory_mb,
            cap.memory_mb,
            settings.SANDBOX_MEMORY_OVERCOMMIT,
            "the live sandboxes and template builds hold",
        ),
        (
            "disk",
            disk_used + volumes_mb,
            template.disk_size_mb,
            cap.disk_mb,
            settings.SANDBOX_DISK_OVERCOMMIT,
            f"the live sandboxes, template builds and volumes ({volumes_mb} MiB) hold",
        ),
    ):
        allowed = int(total * ratio)
        if in_use + asked > allowed:
            raise AtCapacity(
                f"this host is at capacity: {holders} {in_use} MiB of {what} "
                f"and this one needs {asked} MiB more, over the {allowed} MiB it admits; "
                "try again when sandboxes have ended",
                status=503,
                headers={"Retry-After": "5"},
            )
    return node


class VolumeHostFull(BadRequest):
    """This host's disk cannot hold another volume beside its live sandboxes' disks and its
    volumes. A limit, not an answer: an Idempotency-Key is released, so the same key may
    create once sandboxes have ended or volumes are deleted."""

    releases_key = True
    error_code = "volume_host_full"


def volume_admit(*, size_mb: int) -> Node:
    """Admit a new volume of ``size_mb`` on the node :func:`placement` chooses, or raise
    :class:`VolumeHostFull`; returns the node. One statement; the caller holds the team's
    row lock (the team's creates are serialised; other teams' may overshoot by their
    number, as sandboxes')."""
    node, cap = placement()
    host = node.host_id
    disks, volumes = _disk_usage(host)
    allowed = int(cap.disk_mb * settings.SANDBOX_DISK_OVERCOMMIT)
    if disks + volumes + size_mb > allowed:
        raise VolumeHostFull(
            f"this host's disk is at capacity: the live sandboxes' disks hold {disks} MiB and "
            f"the volumes {volumes} MiB, and a new volume takes {size_mb} MiB, over the "
            f"{allowed} MiB it admits; delete a volume, or try again when sandboxes have ended"
        )
    return node


def _builds_sum() -> tuple[str, str]:
    """Scalar subqueries: the memory and the disk of the build sandboxes ``host`` runs (one
    parameter each, the host): a build being run (``building`` and held by a worker) has
    one sandbox of its memory and a disk of BUILD_DISK_MB."""
    builds = connection.ops.quote_name(TemplateBuild._meta.db_table)
    running = f"FROM {builds} WHERE status = 'building' AND lease_owner <> '' AND host IN (%s, '')"
    return (
        f"(SELECT COALESCE(SUM(memory_mb), 0) {running})",
        f"(SELECT COUNT(*) * {BUILD_DISK_MB} {running})",
    )


def _volumes_sum() -> str:
    """A scalar subquery: the size limits of a host's volumes (one parameter, the host).
    Every row counts: ``creating``, ``ready`` and ``deleting`` each may have an image."""
    volumes = connection.ops.quote_name(Volume._meta.db_table)
    return f"(SELECT COALESCE(SUM(size_mb), 0) FROM {volumes} WHERE host IN (%s, ''))"


def _checkpoints() -> bool:
    """Whether the host's driver pauses with memory to disk (its memory then holds none)."""
    return Capability.MEMORY_SNAPSHOTS in capabilities.supported()


def _disk_sum(checkpoints: bool) -> tuple[str, list[str]]:
    """SQL summing a host's live sandboxes' disks (one parameter first, the host) and, where
    memory is checkpointed, the memory of those paused with it; its further parameters."""
    if not checkpoints:
        return "COALESCE(SUM(CASE WHEN host IN (%s, '') THEN disk_size_mb ELSE 0 END), 0)", []
    return (
        "COALESCE(SUM(CASE WHEN host IN (%s, '') THEN disk_size_mb + CASE WHEN state = %s "
        "AND pause_mode = %s THEN memory_mb ELSE 0 END ELSE 0 END), 0)",
        [Sandbox.State.PAUSED.value, Sandbox.PauseMode.FULL.value],
    )


def _disk_usage(host: str) -> tuple[int, int]:
    """The disk ``host``'s live sandboxes were given (with their checkpoints) and its
    volumes' size limits, in MiB."""
    qn = connection.ops.quote_name
    disk_sql, disk_params = _disk_sum(_checkpoints())
    _, builds_disk = _builds_sum()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {disk_sql}, {_volumes_sum()}, {builds_disk} "
            f"FROM {qn(Sandbox._meta.db_table)} WHERE state <> %s",
            [host, *disk_params, host, host, Sandbox.State.KILLED.value],
        )
        row = cursor.fetchone()
    return int(row[0]) + int(row[2]), int(row[1])


def _usage(team_id: int, host: str) -> tuple[int, int, int, int]:
    """Lock the team's row (it serialises the creates of one team, so the count is exact),
    then read the team's live sandboxes (on every host), the memory and disk every live
    sandbox of ``host`` holds, and the size limits of ``host``'s volumes.
    Two statements in plain SQL: through the ORM, compiling them cost more than running
    them (admission took 2.2 ms of every create that way, 0.7 ms now; measured in-process
    on PostgreSQL). The volumes' sum is a scalar subquery of the second: no statement more."""
    qn = connection.ops.quote_name
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    sandboxes = qn(Sandbox._meta.db_table)
    checkpoints = _checkpoints()
    # Memory is held by every live sandbox but one paused with its files only, or, where
    # memory is checkpointed, one paused at all.
    holds_no_memory = "state = %s" if checkpoints else "state = %s AND pause_mode = %s"
    no_memory_params = [Sandbox.State.PAUSED.value]
    if not checkpoints:
        no_memory_params.append(Sandbox.PauseMode.FILESYSTEM.value)
    disk_sql, disk_params = _disk_sum(checkpoints)
    builds_memory, builds_disk = _builds_sum()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {qn(Team._meta.db_table)} WHERE id = %s{lock}", [team_id])
        cursor.execute(
            f"SELECT COALESCE(SUM(CASE WHEN team_id = %s THEN 1 ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN host IN (%s, '') AND NOT ({holds_no_memory})"
            f" THEN memory_mb ELSE 0 END), 0), "
            f"{disk_sql}, {_volumes_sum()}, {builds_memory}, {builds_disk} "
            f"FROM {sandboxes} WHERE state <> %s",
            [
                team_id,
                host,
                *no_memory_params,
                host,
                *disk_params,
                host,
                host,
                host,
                Sandbox.State.KILLED.value,
            ],
        )
        row = cursor.fetchone()
    # The build sandboxes this host runs hold memory and disk as its sandboxes do.
    return int(row[0]), int(row[1]) + int(row[4]), int(row[2]) + int(row[5]), int(row[3])
