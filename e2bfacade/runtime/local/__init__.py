"""The host runtime (see :mod:`.driver`): real Linux sandboxes on this host, as root, each
run by a sandboxer (:mod:`.sandboxer`); the ``local`` driver is it with the namespace
sandboxer (:mod:`.launcher.sandboxer`)."""

from e2bfacade.runtime.local.driver import HostRuntime, LocalRuntime
from e2bfacade.runtime.local.record import LocalSandboxInfo
from e2bfacade.runtime.local.storage.images import BASE_IMAGE

__all__ = ["BASE_IMAGE", "HostRuntime", "LocalRuntime", "LocalSandboxInfo"]
