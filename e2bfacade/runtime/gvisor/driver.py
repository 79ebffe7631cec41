"""The ``gvisor`` driver (``SANDBOX_RUNTIME=gvisor``): the host runtime
(e2bfacade/runtime/local/driver.py) with gVisor's sandboxer (sandboxer.py), which starts,
checkpoints, restores and ends each sandbox with runsc, and says how the host reaches its
guest (guest.py). Everything else — images and layers, disks, records, id slots, volumes,
network rules, pooled disks, the guest agent — is the host runtime's, shared with the
``local`` driver; docs/runtime.md, "The gVisor driver", says what differs for a guest.

The host runtime's options hold; ``spares`` counts pooled disks only (runsc is the
launcher: no spare launchers) and ``warm`` is ignored (no pool of started sandboxes: a
create boots in ~0.3 s).
"""

from __future__ import annotations

from e2bfacade.runtime.gvisor.sandboxer import GvisorSandboxer
from e2bfacade.runtime.gvisor.sandboxer import installed as installed
from e2bfacade.runtime.local.driver import HostRuntime


class GvisorRuntime(HostRuntime):
    """``SANDBOX_RUNTIME=gvisor``: the host runtime with the gVisor sandboxer."""

    sandboxer_class = GvisorSandboxer
    sandboxer: GvisorSandboxer  # as built from sandboxer_class
