"""A host's membership: its key in etcd under a lease, its incarnation, and its fence.

- **Key**: ``<prefix>hosts/<label>`` (the host's opaque label), its value the host's
  :class:`Advert` as JSON, attached to a lease of ``FLEET_LEASE_SECONDS``. A host that
  stops renewing it (dead, cut off from the majority of etcd, or from the database) has its
  key deleted by etcd when the lease lapses: that deletion is what the fleet calls dead.
- **Incarnation**: the key's ``create_revision``. It grows on every new registration and
  stays the same while the key lives, so a quick restart that finds its lease still alive
  (its id is kept in ``SANDBOX_ROOT/fleet/lease``) keeps it. The fleet fences a host by
  incarnation: an etcd transaction conditioned on a stale one is refused.
- **Fence**: each renewal that etcd acknowledged, with the database answering too, writes
  ``SANDBOX_ROOT/fleet/serving``: the incarnation, and until when (CLOCK_MONOTONIC, shared
  by every process of the machine) this host may serve sandbox work. That is half the
  lease's time after the moment the renewal was *sent*: etcd extends the lease from when
  it receives the renewal, later, so the host stops serving at least half a lease before
  etcd can delete its key — whatever the reason the renewals stopped, this process's death
  included.

etcd is reached through its JSON gateway with ``etcd3gw`` (the client OpenStack's tooz
uses): a lease, a put and two conditional transactions per registration, one renewal per
beat.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import Etcd3Exception
from etcd3gw.lease import Lease
from etcd3gw.utils import _encode

log = logging.getLogger(__name__)

FENCE_FILE = "serving"
LEASE_FILE = "lease"


class MembershipError(Exception):
    """This host cannot be (or stay) a member now; the message says why."""


@dataclass(frozen=True)
class Advert:
    """What a host tells the fleet about itself (its key's value)."""

    host_id: str
    name: str
    api_url: str
    sandbox_url: str
    state: str
    capacity: dict[str, int]
    labels: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Advert:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Fence:
    """Whether this host may serve sandbox work, as its member last wrote it, and the state
    the operator gave it (``ready``, or ``draining``/``standby``: no new sandboxes)."""

    incarnation: int
    until: float  # time.monotonic()
    state: str = "ready"

    def holds(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.until


def clients(endpoints: Sequence[str], timeout: float) -> list[Etcd3Client]:
    """A client per endpoint, in order (the host's own member first, by convention)."""
    out = []
    for endpoint in endpoints:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise MembershipError(f"ETCD_ENDPOINTS: {endpoint!r} is not an http(s) URL")
        out.append(
            Etcd3Client(
                host=url.hostname,
                port=url.port or 2379,
                protocol=url.scheme,
                timeout=timeout,
                api_path="/v3/",
            )
        )
    return out


def read_fence(state_dir: Path) -> Fence | None:
    """The fence this host's member last wrote, or None (never, or withdrawn)."""
    try:
        data = json.loads((state_dir / FENCE_FILE).read_text())
        return Fence(
            incarnation=int(data["incarnation"]),
            until=float(data["until"]),
            state=str(data.get("state", "ready")),
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class Member:
    """One host's membership. ``beat`` is called every third of the lease by one process
    of the host (``manage.py run_member``); every other process reads the fence."""

    def __init__(
        self,
        etcd: Sequence[Etcd3Client],
        *,
        prefix: str,
        label: str,
        advert: Callable[[], Advert],
        ttl: int,
        state_dir: Path,
        database_check: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not etcd:
            raise MembershipError("no etcd endpoint")
        self.etcd = list(etcd)
        self.key = f"{prefix}hosts/{label}"
        self.status_key = status_key(prefix, label)
        self.state = "ready"
        self.advert = advert
        self.ttl = ttl
        self.state_dir = state_dir
        self.database_check = database_check
        self.clock = clock
        self.lease: Lease | None = None
        self.incarnation = 0
        state_dir.mkdir(parents=True, exist_ok=True)

    # --- etcd, over the first endpoint that answers --------------------------------------
    def _call(self, what: Callable[[Etcd3Client], Any]) -> Any:
        """``what`` on the endpoint that answered last, then on the others in order. A
        member that stopped answering costs one timeout once, not one per call: a beat
        makes several calls, and must end well within half a lease."""
        last: Exception | None = None
        for client in list(self.etcd):
            try:
                result = what(client)
            except Etcd3Exception as exc:
                last = exc
                continue
            if client is not self.etcd[0]:
                self.etcd.remove(client)
                self.etcd.insert(0, client)
            return result
        raise MembershipError(f"etcd did not answer: {last}")

    def _saved_lease(self, client: Etcd3Client) -> Lease | None:
        try:
            lease_id = int((self.state_dir / LEASE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        lease = Lease(lease_id, client)
        # TTL -1: the lease is gone (expired or revoked).
        return lease if lease.ttl() > 0 else None

    def _claim(self, client: Etcd3Client, lease: Lease) -> bool:
        """Put this host's key under ``lease`` if the key is absent or already ours:
        never over a live key of another lease (another process with this host's label)."""
        key = _encode(self.key)
        advert = replace(self.advert(), state=self.state)
        put = {"request_put": {"key": key, "value": _encode(advert.to_json()),
                               "lease": lease.id}}  # fmt: skip
        for compare in (
            {"key": key, "target": "VERSION", "result": "EQUAL", "version": 0},
            {"key": key, "target": "LEASE", "result": "EQUAL", "lease": lease.id},
        ):
            if client.transaction({"compare": [compare], "success": [put]}).get("succeeded"):
                return True
        return False

    def register(self) -> int:
        """Join (or rejoin) the fleet; returns the incarnation. A lease still alive from
        this host's last run is reused, so a quick restart keeps its incarnation."""

        def register(client: Etcd3Client) -> int:
            lease = self._saved_lease(client) or client.lease(self.ttl)
            if lease.refresh() <= 0:
                lease = client.lease(self.ttl)
            if not self._claim(client, lease):
                raise MembershipError(
                    f"{self.key} is held under another lease: another process runs as this "
                    "host, or this host's last lease has not lapsed yet (its id was lost)"
                )
            kvs = client.get(self.key, metadata=True)
            if not kvs:
                raise MembershipError(f"{self.key} vanished right after it was written")
            _write_atomic(self.state_dir / LEASE_FILE, str(lease.id))
            self.lease = lease
            return int(kvs[0][1]["create_revision"])

        self.database_check()
        self.incarnation = int(self._call(register))
        return self.incarnation

    def beat(self) -> Fence | None:
        """Renew the lease (registering first if there is none, or it lapsed) and move the
        fence. Returns the new fence, or None when the host may not serve: then the old
        fence is left to run out by itself (it never runs past the lease)."""
        sent = self.clock()
        try:
            self.database_check()
            self.state = self._call(lambda client: desired_status(client, self.status_key))
            if self.lease is None:
                self.register()
            else:
                lease = self.lease
                if self._call(lambda client: Lease(lease.id, client).refresh()) <= 0:
                    # The lease lapsed: the fleet thinks this host dead and may have given
                    # its sandboxes up. A new registration is a new incarnation.
                    log.warning("fleet: lease %s lapsed; registering again", lease.id)
                    self.lease = None
                    self.withdraw()
                    self.register()
                else:
                    # The advert (state, capacity) follows, under the same lease.
                    self._call(lambda client: self._claim(client, lease))
        except (MembershipError, Etcd3Exception) as exc:
            log.warning("fleet: cannot renew membership: %s", exc)
            return None
        except Exception as exc:  # the database check: whatever its driver raises
            log.warning("fleet: the database does not answer: %s", exc)
            return None
        fence = Fence(incarnation=self.incarnation, until=sent + self.ttl / 2, state=self.state)
        _write_atomic(self.state_dir / FENCE_FILE, json.dumps(asdict(fence)))
        return fence

    def withdraw(self) -> None:
        """Stop serving at once (the fence file removed)."""
        (self.state_dir / FENCE_FILE).unlink(missing_ok=True)

    def leave(self) -> None:
        """Leave the fleet for good (a decommission): the lease revoked, the key gone."""
        self.withdraw()
        if self.lease is not None:
            lease = self.lease
            self._call(lambda client: Lease(lease.id, client).revoke())
            (self.state_dir / LEASE_FILE).unlink(missing_ok=True)
            self.lease = None

    def run(self, stop: threading.Event) -> None:
        """Beat every third of the lease until ``stop``; a failed beat is retried each
        second. On ``stop`` the lease is kept: a quick restart reuses it."""
        period = max(self.ttl / 3, 1.0)
        while not stop.is_set():
            wait = period if self.beat() is not None else 1.0
            stop.wait(wait)


STATUSES = ("ready", "draining", "standby")  # what the operator sets; the rest are observed


def status_key(prefix: str, label: str) -> str:
    """The operator's status for a host: a key of its own, without a lease, so that it
    outlives the host's restarts (a drained host comes back draining)."""
    return f"{prefix}status/{label}"


def desired_status(client: Etcd3Client, key: str) -> str:
    values = client.get(key)
    status = values[0].decode() if values else "ready"
    return status if status in STATUSES else "ready"


def set_status(etcd: Sequence[Etcd3Client], prefix: str, label: str, status: str) -> None:
    """Give host ``label`` the operator's ``status``; its member applies it on its next beat
    (within a third of its lease)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    last: Exception | None = None
    for client in etcd:
        try:
            client.put(status_key(prefix, label), status)
            return
        except Etcd3Exception as exc:
            last = exc
    raise MembershipError(f"etcd did not answer: {last}")


def members(etcd: Sequence[Etcd3Client], prefix: str) -> list[tuple[str, Advert, int]]:
    """Every live member: (label, advert, incarnation), by label."""
    last: Exception | None = None
    for client in etcd:
        try:
            kvs = client.get_prefix(f"{prefix}hosts/")
        except Etcd3Exception as exc:
            last = exc
            continue
        out = []
        for value, meta in kvs:
            label = meta["key"].decode().rsplit("/", 1)[-1]
            out.append((label, Advert.from_json(value), int(meta["create_revision"])))
        return sorted(out, key=lambda item: item[0])
    raise MembershipError(f"etcd did not answer: {last}")
