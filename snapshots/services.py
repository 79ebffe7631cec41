"""Snapshots: a sandbox's files captured as a template (E2B snapshots are templates: they
are deleted through ``DELETE /templates/{id}`` and used as ``templateID``).

The local driver captures the file system only: processes are not checkpointed (CRIU does
not work on these kernels), so a sandbox started from its snapshot boots fresh processes.
The gvisor driver captures memory too (Capability.MEMORY_SNAPSHOTS): a sandbox started
from its snapshot, or forked, continues the source's processes.
"""

from __future__ import annotations

import hashlib

from django.db import IntegrityError, transaction

from e2bfacade import capabilities
from e2bfacade.errors import ApiError, Conflict
from e2bfacade.models import Team
from e2bfacade.runtime.base import Capability, SandboxNotFound, SandboxRuntimeError
from nodes.selectors import sandbox_runtime
from sandboxes.models import Sandbox
from sandboxes.services import CreateRequest, check_timeout, sandbox_create, sandbox_get
from sandboxes.transitions import not_found, runtime_error
from templates.models import ID_ALPHABET, Template, new_template_id

State = Sandbox.State


def snapshot_create(
    *,
    team: Team,
    sandbox_id: str,
    name: str | None,
    kind: str = Template.Kind.SNAPSHOT,
    snapshot_id: str | None = None,
    memory: bool | None = None,
) -> Template:
    """Capture the sandbox's files as a new template — and, with ``memory`` (None: whenever
    the driver can, as E2B's snapshots do), its running processes. The source keeps
    running (it is frozen, or checkpointed and restored, for the moment the capture
    takes). Without an idempotency key every call is a new snapshot (E2B semantics);
    ``snapshot_id`` lets a keyed retry re-drive the same one: the runtime's snapshot is
    idempotent by that id."""
    if snapshot_id is not None:
        done = Template.objects.filter(pk=snapshot_id, team=team).first()
        if done is not None:
            return done  # a re-drive of a snapshot that was already recorded
    sandbox = sandbox_get(team=team, sandbox_id=sandbox_id)
    runtime = sandbox_runtime(sandbox)  # 503 for a sandbox another host holds
    if sandbox.state not in (State.RUNNING, State.PAUSED):
        raise Conflict(f"sandbox {sandbox_id} is {sandbox.state}; try again shortly")
    if name and Template.objects.filter(team=team, alias=name).exists():
        # A friendly early answer; the unique constraint below is what guarantees it.
        raise Conflict(f"a template or snapshot named '{name}' already exists")
    snapshot_id = snapshot_id or new_template_id()
    try:
        image = runtime.snapshot(sandbox.sandbox_id, snapshot_id, memory=memory_kept(memory))
    except SandboxNotFound as exc:
        raise not_found(sandbox_id) from exc
    except (SandboxRuntimeError, OSError) as exc:
        raise runtime_error(exc) from exc
    try:
        with transaction.atomic():
            template, _ = Template.objects.get_or_create(
                template_id=snapshot_id,
                defaults={
                    "team": team,
                    "alias": name or None,
                    "kind": kind,
                    "image_id": image.image_id,
                    "cpu_count": sandbox.cpu_count,
                    "memory_mb": sandbox.memory_mb,
                    "disk_size_mb": sandbox.disk_size_mb,
                    "pids_max": sandbox.template.pids_max,
                    "envd_version": sandbox.envd_version,
                    "size_bytes": image.size_bytes,
                    "source_sandbox_id": sandbox.sandbox_id,
                },
            )
    except IntegrityError:
        runtime.delete_image(image.image_id)  # nothing half-made survives a lost race
        raise Conflict(f"a template or snapshot named '{name}' already exists") from None
    return template


def memory_kept(asked: bool | None) -> bool:
    """Whether a snapshot keeps memory: as asked (the serializer refused True where the
    driver cannot), or by default wherever the driver can."""
    if asked is not None:
        return asked
    return Capability.MEMORY_SNAPSHOTS in capabilities.supported()


def fork_sandbox_id(fork_id: str, index: int) -> str:
    """The id of fork ``index`` of fork set ``fork_id``: derived, so a re-driven fork
    request adopts the sandboxes a crashed attempt started instead of starting more."""
    digest = int.from_bytes(hashlib.sha256(f"{fork_id}:{index}".encode()).digest()[:16], "big")
    chars = []
    for _ in range(20):
        digest, r = divmod(digest, 36)
        chars.append(ID_ALPHABET[r])
    return "i" + "".join(chars)


def sandbox_fork(
    *, team: Team, sandbox_id: str, timeout: int, count: int, fork_id: str | None = None
) -> list[dict[str, object]]:
    """Start ``count`` sandboxes from the source's current files (and, where the driver
    can, its running processes: each a copy with its own identity). Returns one entry per
    fork, ``{"sandbox": Sandbox}`` or ``{"error": {code, message}}``, as E2B does: one
    fork failing does not fail the others. Idempotent by ``fork_id``."""
    check_timeout(timeout)  # refuse before snapshotting anything
    image = snapshot_create(
        team=team, sandbox_id=sandbox_id, name=None, kind=Template.Kind.FORK, snapshot_id=fork_id
    )
    request = CreateRequest(template_ref=image.template_id, timeout=timeout)
    results: list[dict[str, object]] = []
    for index in range(count):
        try:
            sandbox = sandbox_create(
                team=team, request=request, sandbox_id=fork_sandbox_id(image.template_id, index)
            )
            results.append({"sandbox": sandbox})
        except ApiError as exc:
            results.append({"error": {"code": exc.status, "message": exc.message}})
    return results
