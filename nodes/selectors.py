"""The seam between the API and the hosts that run sandboxes: which node holds a sandbox or a
volume, the runtime that acts on a node's sandboxes, where a create may be placed, and what a
node can hold. Every app above this one asks here, never :mod:`e2bfacade.sandbox_runtime`
(tests/test_architecture.py checks it), so a layer of several hosts changes this module and
not the services that call it.

Today a service is one node: the host of this process's runtime (``Runtime.host_id``, the
machine's name and its runtime root). A row that names another host (several hosts may
share one database) is answered here, once, with the truth: a 503 naming that host by an
opaque label (:func:`node_for_sandbox`, :func:`node_for_volume`). Placement has one
candidate, this node; a node's capacity is what its runtime reports.

A function that builds the runtime (the first :func:`local_node` of a process does) must be
called before a transaction opens: no runtime work inside one. Pass the node it returns as
``local`` to a check made under a row lock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from e2bfacade.errors import ApiError, ServiceUnavailable
from e2bfacade.fleet import host as fleet_host
from e2bfacade.runtime.base import Capacity, Runtime
from e2bfacade.sandbox_runtime import get_runtime


@dataclass(frozen=True)
class Node:
    """A host of this service, by its runtime's ``host_id``."""

    host_id: str

    @property
    def label(self) -> str:
        """What callers read of the node (:func:`host_label`)."""
        return host_label(self.host_id)


class SandboxRow(Protocol):
    """What the seam reads of a sandbox's row (``sandboxes.Sandbox``)."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def host(self) -> str: ...


class VolumeRow(Protocol):
    """What the seam reads of a volume's row (``sandboxes.Volume``)."""

    @property
    def volume_id(self) -> object: ...

    @property
    def host(self) -> str: ...


def host_label(host: str) -> str:
    """An opaque, stable name for a host in what callers read: a host id is the machine's
    name and its runtime root's path, which are the operator's to know, not a tenant's.
    The operator finds a label's host with ``host_label`` over the hosts' ids."""
    return hashlib.sha256(host.encode()).hexdigest()[:12]


def local_node() -> Node:
    """The node this process serves: its runtime's host (built on first use, so call this
    outside a transaction; raises ``RuntimeUnavailable`` on a host that cannot run one)."""
    return Node(get_runtime().host_id)


def node_named(host: str | None, *, local: Node | None = None) -> Node:
    """The node a row's ``host`` names. A row without one predates hosts: it is the one
    host there was, this one."""
    here = local or local_node()
    return here if not host or host == here.host_id else Node(host)


def is_local(host: str | None, *, local: Node | None = None) -> bool:
    """Whether a row's ``host`` names this process's node."""
    here = local or local_node()
    return node_named(host, local=here) == here


def runtime_for(node: Node) -> Runtime:
    """The runtime that acts on ``node``'s sandboxes. Only this process's node has one: a
    row naming another host is answered by :func:`node_for_sandbox` before any runtime is
    asked for, so reaching here with another node is a bug, not a request to answer."""
    runtime = get_runtime()
    if node.host_id != runtime.host_id:
        raise LookupError(f"no runtime of this process acts on host {node.label}")
    # In a fleet, a host that cannot prove it is alive does no sandbox work: the fleet may
    # be giving its sandboxes up (e2bfacade/fleet/host.py).
    fleet_host.check_serving()
    return runtime


def local_runtime() -> Runtime:
    """This process's node's runtime: for what is this host's by nature (its sweeps, its
    warm pools, its images, a data-plane request that found its guest here)."""
    return runtime_for(local_node())


def node_for_sandbox(sandbox: SandboxRow, *, local: Node | None = None) -> Node:
    """The node that holds ``sandbox``, or the 503 for a sandbox another host of this
    service holds: the truth, never an outcome this host cannot bring about (requests are
    not forwarded between hosts)."""
    here = local or local_node()
    node = node_named(sandbox.host, local=here)
    if node != here:
        raise elsewhere(
            f"sandbox {sandbox.sandbox_id} is held by another host of this service (host "
            f"{node.label}), not by this one: send the request to that host's API",
            error_code="sandbox_on_another_host",
        )
    return node


def node_for_sandbox_id(sandbox_id: str, host: str | None) -> Node:
    """:func:`node_for_sandbox` of a row read as values (``sandbox_id``, ``host``)."""
    return node_for_sandbox(_HeldSandbox(sandbox_id, host or ""))


def sandbox_runtime(sandbox: SandboxRow, *, local: Node | None = None) -> Runtime:
    """The runtime that acts on ``sandbox`` (:func:`node_for_sandbox`, then
    :func:`runtime_for`)."""
    return runtime_for(node_for_sandbox(sandbox, local=local))


def node_for_volume(volume: VolumeRow, *, local: Node | None = None) -> Node:
    """The node that stores ``volume``, or the 503 for a volume on another host: only that
    host creates, mounts, serves or deletes it."""
    here = local or local_node()
    node = node_named(volume.host, local=here)
    if node != here:
        raise elsewhere(
            f"volume {volume.volume_id} is stored on another host of this service (host "
            f"{node.label}), not on this one: send the request to that host's API",
            error_code="volume_on_another_host",
        )
    return node


def node_for_volume_id(volume_id: object, host: str | None) -> Node:
    """:func:`node_for_volume` of a row read as values (``volume_id``, ``host``)."""
    return node_for_volume(_HeldVolume(volume_id, host or ""))


def elsewhere(message: str, *, error_code: str) -> ApiError:
    """The one answer for a resource another host holds (the data plane renders it in its
    own shape, with the same status and ``Should-Retry``)."""
    return ServiceUnavailable(message, error_code=error_code, headers={"Should-Retry": "false"})


def placement_candidates() -> list[Node]:
    """The nodes a create may be placed on, best first: this one, unless in a fleet its
    operator made it take no new sandboxes (``draining``, ``standby``: a 503 that sends
    the create back to the front). Admission then checks the chosen node's capacity in the
    create's own transaction."""
    fleet_host.check_placeable()
    return [local_node()]


def node_capacity(node: Node) -> Capacity:
    """What ``node`` can give sandboxes, as its runtime reports it (held in memory once the
    runtime is built). Raises ``SandboxRuntimeError`` when it has no runtime to ask."""
    return runtime_for(node).capacity()


@dataclass(frozen=True)
class _HeldSandbox:
    sandbox_id: str
    host: str


@dataclass(frozen=True)
class _HeldVolume:
    volume_id: object
    host: str
