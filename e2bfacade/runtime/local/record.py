"""A local sandbox's record: ``sandboxes/<id>/state.json``, typed.

The record is written last when a sandbox is made (its presence means "created") and
replaced whole, atomically, at every change (atomic.write_json). It holds what a sandbox
was created with — enough to start it again on its disk (a cold boot) — and who its init
is now (pid and kernel start time; 0 while it has no processes).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import (
    DEFAULT_USER,
    MIN_DISK_MB,
    Capacity,
    CreateRefused,
    NetworkPolicy,
    SandboxInfo,
    SandboxSpec,
    UpstreamProxy,
    check_id,
)
from e2bfacade.runtime.local.atomic import write_json
from e2bfacade.runtime.volumes import MAX_MOUNTS_PER_SANDBOX, VolumeMount

DEFAULT_DISK_MB: int = SandboxSpec("-", "-").disk_mb
FILE = "state.json"
HOSTNAME_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LocalSandboxInfo(SandboxInfo):
    init_pid: int = 0  # the sandbox's PID 1 on the host


@dataclass(frozen=True)
class Parked:
    """A sandbox with no processes: paused filesystem only, or its processes died under it
    (``reason`` says so; None for a pause a caller asked for) — or, with ``memory``, paused
    with its processes' memory checkpointed to its directory (a driver that can: gVisor),
    which a resume restores."""

    reason: str | None
    at: float
    memory: bool = False


@dataclass(frozen=True)
class SandboxRecord:
    sandbox_id: str
    image_id: str
    id_base: int  # the host id of the sandbox's guest id 0
    cpu_count: int
    memory_mb: int
    pids_max: int
    disk_mb: int
    created_at: float
    init_pid: int = 0
    init_start: int = 0
    booted_at: float = 0.0
    hostname: str = ""
    # What every process started in it gets (the directory is root-only, 0700).
    env_vars: Mapping[str, str] = field(default_factory=dict)
    image_env: Mapping[str, str] = field(default_factory=dict)  # the template's, under env_vars
    image_workdir: str | None = None  # where processes that name no cwd start (the template's)
    default_user: str = DEFAULT_USER
    envd_access_token: str | None = None
    traffic_access_token: str | None = None
    mask_request_host: str | None = None
    network: NetworkPolicy | None = None  # None: no link (the runtime had no networking)
    warm: str | None = None  # a pool sandbox's shape key (pools/warm.py)
    warm_version: str | None = None
    parked: Parked | None = None
    # Mounted at every launch (a create, a cold boot), in this order.
    volume_mounts: tuple[VolumeMount, ...] = ()

    @property
    def is_warm(self) -> bool:
        return self.warm is not None

    def replace(self, **changes: Any) -> SandboxRecord:
        return dataclasses.replace(self, **changes)

    def spec(self) -> SandboxSpec:
        """The spec it was created with (for a cold boot)."""
        return SandboxSpec(
            sandbox_id=self.sandbox_id,
            image_id=self.image_id,
            cpu_count=self.cpu_count,
            memory_mb=self.memory_mb,
            pids_max=self.pids_max,
            disk_mb=self.disk_mb,
            hostname=self.hostname,
            env_vars=self.env_vars,
            default_user=self.default_user,
            envd_access_token=self.envd_access_token,
            traffic_access_token=self.traffic_access_token,
            mask_request_host=self.mask_request_host,
            network=self.network or NetworkPolicy(),
            volume_mounts=self.volume_mounts,
        )

    def save(self, sandbox_dir: Path) -> None:
        """Replace the record, atomically: the commit point of every change."""

        write_json(sandbox_dir / FILE, self.to_json())

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "sandbox_id": self.sandbox_id,
            "image_id": self.image_id,
            "id_base": self.id_base,
            "cpu_count": self.cpu_count,
            "memory_mb": self.memory_mb,
            "pids_max": self.pids_max,
            "disk_mb": self.disk_mb,
            "created_at": self.created_at,
            "init_pid": self.init_pid,
            "init_start": self.init_start,
            "booted_at": self.booted_at,
            "hostname": self.hostname,
            "env_vars": dict(self.env_vars),
            "image_env": dict(self.image_env),
            "image_workdir": self.image_workdir,
            "default_user": self.default_user,
            "envd_access_token": self.envd_access_token,
            "traffic_access_token": self.traffic_access_token,
            "mask_request_host": self.mask_request_host,
            "network": None if self.network is None else policy_json(self.network),
        }
        if self.volume_mounts:
            data["volume_mounts"] = [
                {"volume_id": m.volume_id, "path": m.path} for m in self.volume_mounts
            ]
        if self.warm is not None:
            data["warm"] = self.warm
            data["warm_version"] = self.warm_version
        if self.parked is not None:
            data["paused"] = {
                "mode": "full" if self.parked.memory else "filesystem",
                "reason": self.parked.reason,
                "at": self.parked.at,
            }
        return data

    @classmethod
    def load(cls, sandbox_dir: Path) -> SandboxRecord | None:
        """The record in ``sandbox_dir``, whatever sandbox it names (a pool claim); None when
        there is none."""
        try:
            return cls.from_json(json.loads((sandbox_dir / FILE).read_text()))
        except FileNotFoundError:
            return None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxRecord:
        network = data.get("network")
        paused = data.get("paused")
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            image_id=str(data["image_id"]),
            id_base=int(data.get("id_base") or 0),
            cpu_count=int(data["cpu_count"]),
            memory_mb=int(data["memory_mb"]),
            pids_max=int(data["pids_max"]),
            disk_mb=int(data.get("disk_mb") or DEFAULT_DISK_MB),
            created_at=float(data["created_at"]),
            init_pid=int(data.get("init_pid") or 0),
            init_start=int(data.get("init_start") or 0),
            booted_at=float(data.get("booted_at") or 0.0),
            hostname=str(data.get("hostname") or ""),
            env_vars=dict(data.get("env_vars") or {}),
            image_env=dict(data.get("image_env") or {}),
            image_workdir=data.get("image_workdir") or None,
            default_user=str(data.get("default_user") or DEFAULT_USER),
            envd_access_token=data.get("envd_access_token"),
            traffic_access_token=data.get("traffic_access_token"),
            mask_request_host=data.get("mask_request_host"),
            network=None if network is None else policy_of(network),
            warm=data.get("warm"),
            warm_version=data.get("warm_version"),
            parked=None
            if not paused
            else Parked(
                paused.get("reason"), float(paused["at"]), memory=paused.get("mode") == "full"
            ),
            volume_mounts=tuple(
                VolumeMount(str(m["volume_id"]), str(m["path"]))
                for m in data.get("volume_mounts") or ()
            ),
        )


def policy_json(policy: NetworkPolicy) -> dict[str, Any]:
    return {
        "allow_internet": policy.allow_internet,
        "allow_out": list(policy.allow_out),
        "deny_out": list(policy.deny_out),
        "dns_servers": None if policy.dns_servers is None else list(policy.dns_servers),
        "upstream": None
        if policy.upstream is None
        else {"address": policy.upstream.address, "username": policy.upstream.username},
        "transforms": [
            [domain, [list(h) for h in headers]] for domain, headers in policy.transforms
        ],
    }


def policy_of(data: Mapping[str, Any]) -> NetworkPolicy:
    dns = data.get("dns_servers")
    upstream = data.get("upstream")
    return NetworkPolicy(
        upstream=None
        if not upstream
        else UpstreamProxy(str(upstream["address"]), upstream.get("username")),
        allow_internet=bool(data.get("allow_internet")),
        allow_out=tuple(data.get("allow_out") or ()),
        deny_out=tuple(data.get("deny_out") or ()),
        dns_servers=None if dns is None else tuple(dns),
        transforms=tuple(
            (str(domain), tuple((str(k), str(v)) for k, v in headers))
            for domain, headers in data.get("transforms") or ()
        ),
    )


def check_spec(spec: SandboxSpec, cap: Capacity, networked: bool) -> None:
    """Refuse (CreateRefused) a spec this host cannot make, before anything is made."""
    for name, value, low, high in (
        ("cpu_count", spec.cpu_count, 1, cap.cpus),
        ("memory_mb", spec.memory_mb, 16, cap.memory_mb),
        ("pids_max", spec.pids_max, 8, cap.pids),
        ("disk_mb", spec.disk_mb, MIN_DISK_MB, cap.disk_mb),
    ):
        if not low <= value <= high:
            raise CreateRefused(f"{name} must be between {low} and {high}, got {value}")
    if spec.hostname and not HOSTNAME_PATTERN.fullmatch(spec.hostname):
        raise CreateRefused(f"hostname {spec.hostname!r} is not a valid host name")
    if not networked and not spec.network.is_isolated:
        raise CreateRefused(
            "this runtime has no networking configured (SANDBOX_UPLINK): sandboxes have "
            "their own loopback only"
        )
    for env_name, env_value in spec.env_vars.items():
        if not ENV_NAME.fullmatch(env_name) or "\0" in env_value:
            raise CreateRefused(f"environment variable {env_name!r} is not valid")
    check_mounts(spec.volume_mounts)


def check_mounts(mounts: tuple[VolumeMount, ...]) -> None:
    """Refuse volume mounts no sandbox can have: more than MAX_MOUNTS_PER_SANDBOX, a path
    that is not absolute and clean (or is ``/``), one path twice or one inside another."""
    if len(mounts) > MAX_MOUNTS_PER_SANDBOX:
        raise CreateRefused(
            f"a sandbox may mount at most {MAX_MOUNTS_PER_SANDBOX} volumes, got {len(mounts)}"
        )
    paths: list[str] = []
    for i, mount in enumerate(mounts):
        if not isinstance(mount, VolumeMount):
            raise CreateRefused(f"volume mount #{i} is not a VolumeMount")
        check_id(mount.volume_id, "volume id")
        path = mount.path
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or posixpath.normpath(path) != path
            or path.startswith("//")
            or path == "/"
            or "\0" in path
            or len(path.encode()) > 1024
        ):
            raise CreateRefused(
                f"volume mount #{i}: path {path!r} must be absolute, clean and not /"
            )
        for other in paths:
            if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                raise CreateRefused(f"volume mount #{i}: path {path} is {other} or nested with it")
        paths.append(path)
