"""The background refill of the spare launchers and the disk pool (spares.py, disks.py):
after each create and at each sweep, at most one thread per process, one filler per root
at a time (each pool's own lock)."""

from __future__ import annotations

import logging
import threading

from e2bfacade.runtime.local.pools.disks import DiskPool
from e2bfacade.runtime.local.pools.spares import Spares
from e2bfacade.runtime.local.record import DEFAULT_DISK_MB

log = logging.getLogger(__name__)
SIZES_KEPT = 4  # the disk sizes of the most recent creates the disk pool keeps


class Refill:
    def __init__(self, spares: Spares, disks: DiskPool) -> None:
        self.spares = spares
        self.disks = disks
        self._sizes: dict[int, None] = {DEFAULT_DISK_MB: None}  # most recent last
        self._running = threading.Lock()

    def after_create(self, disk_mb: int | None = None) -> None:
        """Refill in a background thread; ``disk_mb``: the size a create just took."""
        if disk_mb is not None:
            self._sizes.pop(disk_mb, None)
            self._sizes[disk_mb] = None
            while len(self._sizes) > SIZES_KEPT:
                del self._sizes[next(iter(self._sizes))]
        if not self.spares.target or not self._running.acquire(blocking=False):
            return
        threading.Thread(target=self._refill, name="e2bfacade-spares", daemon=True).start()

    def _refill(self) -> None:
        try:
            self.spares.fill()
            for size in reversed(list(self._sizes)):
                self.disks.fill(size)
        except Exception:  # noqa: BLE001 - a refill is an optimisation: log and go on
            log.exception("refilling spare launchers and disks failed")
        finally:
            self._running.release()

    def discard(self) -> None:
        """End every parked launcher and pooled disk (a refill running stops soon)."""
        self.spares.closed = self.disks.closed = True
        with self._running:
            self.spares.discard()
            self.disks.discard()
