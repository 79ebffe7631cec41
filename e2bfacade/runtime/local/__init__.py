"""The ``local`` driver (see :mod:`.driver`): real Linux sandboxes on this host, as root."""

from e2bfacade.runtime.local.driver import LocalRuntime
from e2bfacade.runtime.local.record import LocalSandboxInfo
from e2bfacade.runtime.local.storage.images import BASE_IMAGE

__all__ = ["BASE_IMAGE", "LocalRuntime", "LocalSandboxInfo"]
