"""A snapshot of a host runtime's sandbox: its writable layer copied into a new image
(storage: images.py publishes it, trees.py copies it) — with, for a sandboxer that
checkpoints (Capability.MEMORY_SNAPSHOTS), its processes' memory beside it. Each takes the
host's parts, the sandbox's record and info as the host resolved them under its lock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from e2bfacade.runtime.base import ImageInfo, LimitExceeded, PauseMode, SandboxState
from e2bfacade.runtime.local.parts import HostParts
from e2bfacade.runtime.local.record import LocalSandboxInfo, SandboxRecord
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.local.storage.image_meta import ImageMeta


def capture(
    parts: HostParts,
    record: SandboxRecord,
    info: LocalSandboxInfo,
    image_id: str,
    *,
    id_shift: int,
) -> ImageInfo:
    """Capture the sandbox's files as image ``image_id``. The sandbox is frozen while its
    layer is copied, so the snapshot is consistent; sparse files stay sparse, a layer over
    ``snapshot_max_bytes`` is refused; ``id_shift`` maps its disk's ids to guest ids.
    Caller holds the id's lock and checked the image does not exist."""
    sandbox_id = record.sandbox_id
    d = parts.layout.sandbox_dir(sandbox_id)
    if info.pause_mode is PauseMode.FILESYSTEM:
        disks.ensure_mounted(d)
    froze = info.state is SandboxState.RUNNING

    def make(tmp: Path) -> ImageMeta:
        if froze:
            parts.cgroups.freeze(sandbox_id)
        try:
            (tmp / "rootfs").rmdir()
            trees.copy_layer(
                d / disks.MOUNT / "upper",
                tmp / "rootfs",
                max_bytes=parts.snapshot_max_bytes,
                id_shift=id_shift,
            )
        except trees.TreeTooLarge:
            mib = parts.snapshot_max_bytes >> 20
            raise LimitExceeded(
                f"sandbox {sandbox_id} holds more than the snapshot limit of {mib} MiB "
                "of written files; delete some and try again"
            ) from None
        finally:
            if froze:
                parts.cgroups.thaw(sandbox_id)
        return ImageMeta(image_id, parent=info.image_id)

    return parts.images.publish(image_id, make)


def capture_memory(
    parts: HostParts,
    record: SandboxRecord,
    info: LocalSandboxInfo,
    image_id: str,
    *,
    copy_memory: Callable[[str, Path], None],
) -> ImageInfo:
    """Capture the sandbox's files and its saved processes (``copy_memory``: the
    sandboxer's) as image ``image_id``, taken while it is checkpointed, so the two agree.
    Caller holds the id's lock and has paused it with its memory."""
    sandbox_id = record.sandbox_id
    d = parts.layout.sandbox_dir(sandbox_id)

    def make(tmp: Path) -> ImageMeta:
        (tmp / "rootfs").rmdir()
        try:
            trees.copy_layer(
                d / disks.MOUNT / "upper", tmp / "rootfs", max_bytes=parts.snapshot_max_bytes
            )
        except trees.TreeTooLarge:
            raise LimitExceeded(
                f"sandbox {sandbox_id} holds more than the snapshot limit of "
                f"{parts.snapshot_max_bytes >> 20} MiB of written files"
            ) from None
        copy_memory(sandbox_id, tmp)
        return ImageMeta(image_id, parent=info.image_id, memory=True)

    return parts.images.publish(image_id, make)
