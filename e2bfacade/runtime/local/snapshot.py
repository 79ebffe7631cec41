"""A snapshot of a local sandbox: its writable layer copied into a new image (storage:
images.py publishes it, trees.py copies it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from e2bfacade.runtime.base import ImageInfo, LimitExceeded, PauseMode, SandboxState, check_id
from e2bfacade.runtime.local.storage import disks, trees
from e2bfacade.runtime.local.storage.image_meta import ImageMeta

if TYPE_CHECKING:
    from e2bfacade.runtime.local.driver import LocalRuntime


def capture(rt: LocalRuntime, sandbox_id: str, image_id: str) -> ImageInfo:
    """Capture the sandbox's files as image ``image_id`` (idempotent by that id). The
    sandbox is frozen while its layer is copied, so the snapshot is consistent; sparse
    files stay sparse, and a layer over ``snapshot_max_bytes`` is refused."""
    check_id(image_id, "image id")
    with rt.layout.locked("sandbox", sandbox_id):
        record, info = rt._require(sandbox_id, SandboxState.RUNNING, SandboxState.PAUSED)
        if rt.images.exists(image_id):
            return rt.images.info(image_id)
        d = rt.layout.sandbox_dir(sandbox_id)
        if info.pause_mode is PauseMode.FILESYSTEM:
            disks.ensure_mounted(d)
        froze = info.state is SandboxState.RUNNING

        def make(tmp: Path) -> ImageMeta:
            if froze:
                rt.cgroups.freeze(sandbox_id)
            try:
                (tmp / "rootfs").rmdir()
                trees.copy_layer(
                    d / disks.MOUNT / "upper",
                    tmp / "rootfs",
                    max_bytes=rt.snapshot_max_bytes,
                    id_shift=-rt.disk_id_base(record.id_base),
                )
            except trees.TreeTooLarge:
                mib = rt.snapshot_max_bytes >> 20
                raise LimitExceeded(
                    f"sandbox {sandbox_id} holds more than the snapshot limit of {mib} MiB "
                    "of written files; delete some and try again"
                ) from None
            finally:
                if froze:
                    rt.cgroups.thaw(sandbox_id)
            return ImageMeta(image_id, parent=info.image_id)

        return rt.images.publish(image_id, make)
