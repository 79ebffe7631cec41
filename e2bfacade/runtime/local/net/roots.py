"""The runtime roots of this host, and what each claims of the host's network.

Every runtime root with networking puts rules into host-wide places: a range of addresses
(``SANDBOX_NETWORK_CIDR``), policy-routing rules at preferences of its own, two routing
tables, two packet marks, an nftables table, interface names and the egress proxy's port.
Two roots that claim the same of any of these break each other, and silently: the rules of
the one with the lower preference capture the other's sandbox traffic and send it out of
its own uplink. So each root registers its claim here before it installs anything, and a
claim that collides with another root's is refused with a message naming that root.

The registry is a directory under ``/run`` (a tmpfs: it starts empty at boot, as the
kernel's routing and nftables state does), one JSON file per root, named by the root's
digest, and a lock file; every change is made under an exclusive ``flock`` of it, and the
claimer installs its rules while it still holds it, so another root sees either no claim
or a claim with its rules in the kernel. A claim stands until its root is torn down
(``SandboxNetwork.teardown``, ``manage.py teardown_root``), or until the kernel holds
nothing of it any more (its table and its rules gone: a crash right after the claim, an
operator's ``nft flush ruleset``); such a claim is dropped by the next claimer.

What is derived from what: the nftables table and the interface names from the root's
digest (a hash of its path, as its cgroups); the routing preferences, tables and marks from
a *number* the registry gives the root — the digest's own (the same as a root registered
alone always had) unless another root holds it or one next to it; the egress port is the
configured one, or the first free one from ``DEFAULT_PROXY_PORT``.

Host ids are claimed here too, by every root (with networking or not): each root's
sandboxes run as host ids of a *block* of its own (state.py: 4096 ranges of 65536 ids),
so two roots' sandboxes never run as the same host uid (one could signal, trace or read
the other's files as its own). What they guard is files, not kernel state, so these
claims are kept where a reboot does not empty them (``ID_REGISTRY``, with its own lock),
one file per root; the root records its block itself (``ids/block.json``) and keeps it
for its life. A root with no record takes the first free block (block 0 last), unless it
has sandboxes already: made before roots had blocks, they are owned by block 0, which it
claims. A block another root holds is refused, naming that root. A claim stands while
its root records that block and has sandboxes or a process that has the root open
(state.Layout holds a lock of the root shared); else the next claimer drops it. 2^32 ids
hold only ``ID_BLOCKS`` (15) blocks above the first 2^20: past them a root is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2bfacade.runtime.local.atomic import write_json
from e2bfacade.runtime.local.ids import (
    ID_BLOCK,
    ID_BLOCKS,
    ID_RANGE,
    ID_SLOTS,
    block_base,
    block_in_use,
    holds_sandboxes,
    record_block,
    recorded_block,
)

REGISTRY = Path("/run/e2bfacade/roots")
# Beside, not under, SANDBOX_ROOT's default (/var/lib/e2bfacade): no root's own directory.
ID_REGISTRY = Path("/var/lib/e2bfacade-roots/id-blocks")
DEFAULT_PROXY_PORT = 49990
PROXY_PORTS_TRIED = 1000
NUMBERS = 10000  # routing tables 20000 + n and 30000 + n, preferences 20000 + n - 1 .. + 1
NUMBER_SPACING = 3  # two roots' preference spans (n - 1 .. n + 1) never touch


class RootConflict(Exception):
    """This root's claim collides with another root's (the message names it)."""


@dataclass(frozen=True)
class RootClaim:
    """What one runtime root holds of the host's network."""

    root: str
    digest: str
    cidr: str
    uplink: str
    proxy_port: int
    number: int

    @property
    def ifprefix(self) -> str:
        return f"e2b{self.digest[:4]}"

    @property
    def table(self) -> str:
        return f"e2bfacade_{self.digest[:8]}"

    @property
    def route_table(self) -> int:
        """Where sandbox traffic (and the egress proxy's, by its mark) is routed: the uplink."""
        return 20000 + self.number

    @property
    def divert_table(self) -> int:
        """Where connections diverted to the egress proxy are routed: this host (TPROXY)."""
        return 30000 + self.number

    @property
    def rule_pref(self) -> int:
        return 20000 + self.number  # before "main" (32766)

    @property
    def mark(self) -> int:
        """The egress proxy's sockets' mark (a positive int: ``SO_MARK`` takes an int)."""
        return 0x62B00000 | self.number

    @property
    def divert_mark(self) -> int:
        """The mark of a sandbox's packets on their way to the egress proxy."""
        return 0x62B10000 | self.number

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RootClaim:
        return cls(
            root=str(data["root"]),
            digest=str(data["digest"]),
            cidr=str(data["cidr"]),
            uplink=str(data["uplink"]),
            proxy_port=int(data["proxy_port"]),
            number=int(data["number"]),
        )


def preferred_number(digest: str) -> int:
    return int(digest[:4], 16) % NUMBERS


@contextlib.contextmanager
def locked(registry: Path = REGISTRY) -> Iterator[None]:
    """The registry's lock, held across a claim and the installing of its rules."""
    # Root's alone: another account that could open the lock could hold it and stall
    # every root's start, and one that could write a claim could refuse or steer one.
    for directory in (registry.parent, registry):
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
    fd = os.open(
        registry.parent / f"{registry.name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    with open(fd, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def find(digest: str, registry: Path = REGISTRY) -> RootClaim | None:
    """The root ``digest``'s claim, or None."""
    try:
        return RootClaim.from_json(json.loads((registry / f"{digest}.json").read_text()))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def claims(registry: Path = REGISTRY) -> list[RootClaim]:
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(registry.glob("*.json")):
            claim = find(path.stem, registry)
            if claim is not None:
                found.append(claim)
    return found


def claim(
    *,
    root: Path,
    digest: str,
    cidr: str,
    uplink: str,
    proxy_port: int | None,
    installed: Callable[[RootClaim], bool],
    registry: Path = REGISTRY,
    write: bool = True,
) -> RootClaim:
    """Register (or renew) the root's claim and return it; the caller holds :func:`locked`
    and installs its rules before letting go. ``installed`` tells whether the kernel still
    holds anything of another root's claim (if not, that claim is dropped). Raises
    :class:`RootConflict` naming the other root when the range, the port or the names
    collide. ``write=False`` only checks (and answers what would be claimed)."""
    own = find(digest, registry)
    others = []
    for other in claims(registry):
        if other.digest == digest:
            continue
        if installed(other):
            others.append(other)
        elif write:
            (registry / f"{other.digest}.json").unlink(missing_ok=True)
    net = ipaddress.IPv4Network(cidr)
    for other in others:
        where = f"the runtime root {other.root} (registered in {registry / other.digest}.json)"
        undo = (
            f"stop and tear it down first (SANDBOX_ROOT={other.root} python manage.py "
            "teardown_root) if it is no longer used"
        )
        if net.overlaps(ipaddress.IPv4Network(other.cidr)):
            raise RootConflict(
                f"SANDBOX_NETWORK_CIDR {cidr} of the runtime root {root} overlaps {other.cidr} "
                f"of {where}: sandbox traffic of one would be routed as the other's. Give this "
                f"root another range, or {undo}"
            )
        if proxy_port is not None and proxy_port == other.proxy_port:
            raise RootConflict(
                f"SANDBOX_EGRESS_PORT {proxy_port} of the runtime root {root} is the egress "
                f"port of {where}. Choose another port (or 'auto'), or {undo}"
            )
        if other.ifprefix == f"e2b{digest[:4]}":
            raise RootConflict(
                f"the runtime root {root} would name its sandboxes' interfaces as {where} does "
                f"({other.ifprefix}*; both names hash alike). Choose another SANDBOX_ROOT path, "
                f"or {undo}"
            )
    number = _number(digest, own, others)
    port = proxy_port or _port(own, others)
    made = RootClaim(str(root), digest, str(net), uplink, port, number)
    if write and made != own:
        write_json(registry / f"{digest}.json", made.to_json())
    return made


def release(digest: str, registry: Path = REGISTRY) -> None:
    """Drop the root's claim (its rules are gone)."""
    with locked(registry):
        (registry / f"{digest}.json").unlink(missing_ok=True)


def _free(number: int, others: list[RootClaim]) -> bool:
    return all(abs(number - o.number) >= NUMBER_SPACING for o in others)


def number_free(number: int, digest: str, registry: Path = REGISTRY) -> bool:
    """Whether no other root's claim (live or not) holds ``number`` or one next to it."""
    return _free(number, [c for c in claims(registry) if c.digest != digest])


def _number(digest: str, own: RootClaim | None, others: list[RootClaim]) -> int:
    def free(n: int) -> bool:
        return _free(n, others)

    if own is not None and free(own.number):
        return own.number
    start = preferred_number(digest)
    for step in range(NUMBERS):
        n = (start + step) % NUMBERS
        if free(n):
            return n
    raise RootConflict("every routing number is held by another runtime root of this host")


def _port(own: RootClaim | None, others: list[RootClaim]) -> int:
    """The root's egress port when none is configured: the one it holds, else the first
    from DEFAULT_PROXY_PORT that no other root holds and nothing on this host listens on."""
    taken = {o.proxy_port for o in others}
    if own is not None and own.proxy_port not in taken:
        return own.proxy_port
    for port in range(DEFAULT_PROXY_PORT, DEFAULT_PROXY_PORT + PROXY_PORTS_TRIED):
        if port not in taken and _bindable(port):
            return port
    raise RootConflict(
        f"no free egress port from {DEFAULT_PROXY_PORT} to "
        f"{DEFAULT_PROXY_PORT + PROXY_PORTS_TRIED - 1}; set SANDBOX_EGRESS_PORT"
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


# ------------------------------------------------------------------------------ host ids
@dataclass(frozen=True)
class IdClaim:
    """The block of host ids one runtime root holds."""

    root: str
    block: int

    @property
    def first_id(self) -> int:
        return block_base(self.block)

    @property
    def last_id(self) -> int:
        return self.first_id + ID_BLOCK - 1

    def describe(self) -> str:
        return f"host ids {self.first_id}..{self.last_id} (block {self.block})"


def _id_key(root: Path) -> str:
    """The registry file's name for ``root``: long enough that two paths never meet."""
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]


def id_claims(registry: Path = ID_REGISTRY) -> dict[str, IdClaim]:
    """Every registered block claim, by registry key."""
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(registry.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                found[path.stem] = IdClaim(root=str(data["root"]), block=int(data["block"]))
            except (ValueError, KeyError, TypeError):
                continue
    return found


def id_claim_stands(claim: IdClaim) -> bool:
    """Whether ``claim``'s root still holds its block: it records that block, and has
    sandboxes or a process that has it open."""
    root = Path(claim.root)
    try:
        if recorded_block(root) != claim.block:
            return False  # the root is gone, or moved to another block while empty
    except (ValueError, OSError):
        return True  # cannot tell: its sandboxes may be owned by the block
    return holds_sandboxes(root) or block_in_use(root)


def claim_ids(root: Path, *, registry: Path = ID_REGISTRY) -> IdClaim:
    """Register (or renew) the block of host ids of ``root`` and record it in the root;
    the caller holds :func:`locked` of ``registry`` (and the root's block lock shared,
    state.Layout). Raises :class:`RootConflict` naming the root in the way when another
    root holds the block this root's sandboxes are owned by, or when every block is held.
    Claims that no longer stand are dropped."""
    key = _id_key(root)
    try:
        recorded = recorded_block(root)
    except ValueError as exc:
        raise RootConflict(f"{exc}; restore it, or tear the root down") from None
    busy = holds_sandboxes(root)
    registered = id_claims(registry)
    held: dict[int, tuple[Path, IdClaim]] = {}  # block -> (its claim's file, the claim)
    for other_key, other in registered.items():
        if other_key == key:
            continue
        if id_claim_stands(other):
            held.setdefault(other.block, (registry / f"{other_key}.json", other))
        else:
            (registry / f"{other_key}.json").unlink(missing_ok=True)
    # Sandboxes made before roots had blocks run as (and own files of) block 0's ids.
    wanted = recorded if recorded is not None else (0 if busy else None)
    if wanted is not None and wanted in held:
        if busy:
            raise RootConflict(_block_held(root, recorded is None, *held[wanted]))
        wanted = None  # nothing of this root is owned by it yet: it may take another
    if wanted is None:
        # Block 0 last: it is the one a root made before blocks, not restarted yet, needs.
        free = [b for b in (*range(1, ID_BLOCKS), 0) if b not in held]
        if not free:
            raise RootConflict(_blocks_exhausted(root, held))
        wanted = free[0]
    made = IdClaim(str(root), wanted)
    # The claim before the record: a crash between them leaves a claim its root does not
    # record, which the next claimer drops.
    if registered.get(key) != made:
        write_json(registry / f"{key}.json", {"root": made.root, "block": made.block})
    if recorded != wanted:
        record_block(root, wanted)
    return made


def find_ids(root: Path, registry: Path = ID_REGISTRY) -> IdClaim | None:
    """The block claim registered for ``root``, or None."""
    return id_claims(registry).get(_id_key(root))


def release_ids(root: Path, registry: Path = ID_REGISTRY) -> None:
    """Drop the root's block claim once it no longer stands (:func:`id_claim_stands`: no
    sandbox of the root is left, and no process has it open); else keep it."""
    with locked(registry):
        claim = find_ids(root, registry)
        if claim is not None and not id_claim_stands(claim):
            (registry / f"{_id_key(root)}.json").unlink(missing_ok=True)


def _block_held(root: Path, legacy: bool, where: Path, other: IdClaim) -> str:
    whose = "its sandboxes"
    if legacy:
        whose += ", made before each root had host ids of its own,"
    return (
        f"the runtime root {root} cannot start: {whose} run as {other.describe()}, which the "
        f"runtime root {other.root} holds (registered in {where}); the two roots' sandboxes "
        "would run as the same host uids. Tear one of the two down (SANDBOX_ROOT=<root> "
        "python manage.py teardown_root)"
    )


def _blocks_exhausted(root: Path, held: dict[int, tuple[Path, IdClaim]]) -> str:
    listed = ", ".join(f"{c.root} (block {b})" for b, (_, c) in sorted(held.items()))
    return (
        f"the runtime root {root} cannot start: all {ID_BLOCKS} blocks of host ids of this "
        f"host ({ID_SLOTS} ranges of {ID_RANGE} ids each, in the 32-bit id space) are held by "
        f"runtime roots with sandboxes or a running service: {listed}. Tear down a root that "
        "is no longer used (SANDBOX_ROOT=<root> python manage.py teardown_root), or delete it"
    )
