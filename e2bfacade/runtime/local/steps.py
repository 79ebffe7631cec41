"""The steps of a local sandbox's life that start and stop its processes, as methods of the
local runtime (driver.py) that a driver built on it replaces: the gVisor driver
(e2bfacade/runtime/gvisor/driver.py), whose launcher is runsc, keeps everything else of the
local driver (images, disks, records, id slots, volumes, network rules, the guest agent)."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, cast

from e2bfacade.runtime.base import ConsoleLine, SandboxNotFound, StartCommand
from e2bfacade.runtime.local.cgroups import Cgroups
from e2bfacade.runtime.local.launcher import launch
from e2bfacade.runtime.local.net.network import SandboxNetwork
from e2bfacade.runtime.local.record import LocalSandboxInfo, SandboxRecord
from e2bfacade.runtime.local.state import Layout
from e2bfacade.runtime.local.storage.image_meta import ImageMeta
from e2bfacade.runtime.start import load_output, run_kept

if TYPE_CHECKING:
    from e2bfacade.runtime.local.driver import LocalRuntime


class Steps:
    """Mixed into LocalRuntime, which gives it these:"""

    layout: Layout
    cgroups: Cgroups
    network: SandboxNetwork | None

    @property
    def _rt(self) -> LocalRuntime:
        return cast("LocalRuntime", self)

    def launch(self, record: SandboxRecord, chain: builtins.list[ImageMeta]) -> LocalSandboxInfo:
        """Start the prepared sandbox of ``record`` and commit its record (launch.launch)."""
        return launch.launch(self._rt, record, chain)

    def boot(self, record: SandboxRecord) -> LocalSandboxInfo:
        """Cold-boot a sandbox that kept only its files (launch.boot)."""
        return launch.boot(self._rt, record)

    def run_start(self, sandbox_id: str, start: StartCommand) -> None:
        """Run the template's start command in the running sandbox; what it and the ready
        command write is kept in its directory (``start_output``), bounded, whether it comes
        up or not (a failed cold boot leaves it parked, with its output to read)."""
        run_kept(self._rt.guest(sandbox_id), start, self.layout.sandbox_dir(sandbox_id))

    def start_output(self, sandbox_id: str) -> builtins.list[ConsoleLine]:
        """What :meth:`run_start` kept of the sandbox's latest boot (Runtime.start_output)."""
        if not (d := self.layout.sandbox_dir(sandbox_id)).is_dir():
            raise SandboxNotFound(f"sandbox {sandbox_id} does not exist")
        return load_output(d)

    def park(self, record: SandboxRecord, reason: str | None) -> SandboxRecord:
        """End its processes and keep its files (launch.park)."""
        return launch.park(self._rt, record, reason)

    def end_processes(self, name: str) -> None:
        """Kill every process of the sandbox (or pool sandbox) ``name`` and what holds them."""
        launch.end_processes(self._rt, name)

    def disk_id_base(self, id_base: int) -> int:
        """The host id a sandbox's disk stores for guest id 0, for the sandbox whose id
        range starts at ``id_base`` (there: its user namespace maps guest ids to it)."""
        return id_base

    def pause_memory(self, record: SandboxRecord) -> SandboxRecord:
        """Stop the running sandbox's processes where they are, memory kept: a freeze.
        Returns its record as paused."""
        self.cgroups.freeze(record.sandbox_id)
        self._link_up(record.sandbox_id, False)  # no packet in or out while frozen
        return record

    def resume_memory(self, record: SandboxRecord) -> None:
        """Continue what :meth:`pause_memory` stopped: a thaw."""
        self._link_up(record.sandbox_id, True)
        self.cgroups.thaw(record.sandbox_id)

    def _link_up(self, sandbox_id: str, up: bool) -> None:
        slot = self.layout.slot_of(sandbox_id)
        if self.network is not None and slot is not None:
            self.network.set_up(slot, up)

    def restores_processes(self, chain: builtins.list[ImageMeta]) -> bool:
        """Whether a new sandbox of the image ``chain`` starts with processes already
        running (a memory snapshot's), so its template's start command is not run."""
        return False
