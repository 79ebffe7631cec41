"""An image's metadata (``images/<id>/image.json``), typed: :class:`ImageMeta` is one entry
of an image's chain, read from and written to the JSON every host has on disk, whose keys
it keeps as they are (a host upgraded in place reads its images as before).

A chain is the image and its ancestors, top layer first (:meth:`.images.ImageStore.chain`);
what a sandbox of it starts with is read from the chain, the top layer's winning
(:func:`start_of`, :func:`env_of`, :func:`workdir_of`, :func:`host_binds_of`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2bfacade.runtime.specs import DEFAULT_USER, StartCommand


@dataclass(frozen=True)
class ImageMeta:
    """One image: its parent (None: a whole root file system), the host directories bound
    read-only into its sandboxes at the same path (``base``'s ``/usr``...), the environment,
    start command and working directory it gives its sandboxes, whether a checkpoint of
    processes sits beside its files (``memory``: a gVisor memory snapshot), and what
    :meth:`.images.ImageStore.publish` records (its files' size, when it was made, the
    overlay xattr namespace its opaque directories use)."""

    image_id: str
    parent: str | None = None
    host_binds: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    start: StartCommand | None = None
    workdir: str | None = None
    memory: bool = False
    size: int = 0
    created: float = 0.0
    xattrs: str | None = None

    @classmethod
    def from_json(cls, image_id: str, data: Mapping[str, Any]) -> ImageMeta:
        start = data.get("start")
        return cls(
            image_id=image_id,
            parent=data.get("parent"),
            host_binds=tuple(data.get("host_binds") or ()),
            env=dict(data.get("env") or {}),
            start=_start_from_json(start) if start else None,
            workdir=str(data["workdir"]) if data.get("workdir") else None,
            memory=bool(data.get("memory")),
            size=int(data.get("size", 0)),
            created=float(data.get("created", 0)),
            xattrs=data.get("xattrs"),
        )

    def to_json(self) -> dict[str, Any]:
        """The image.json of this image (the id is its directory's name, not in it); keys
        whose value is the default are left out, as they always were."""
        data: dict[str, Any] = {"parent": self.parent, "host_binds": list(self.host_binds)}
        if self.env:
            data["env"] = dict(self.env)
        if self.start is not None:
            data["start"] = dataclasses.asdict(self.start)
        if self.workdir:
            data["workdir"] = self.workdir
        if self.memory:
            data["memory"] = True
        data["size"] = self.size
        if self.xattrs is not None:
            data["xattrs"] = self.xattrs
        data["created"] = self.created
        return data


def _start_from_json(start: Mapping[str, Any]) -> StartCommand:
    return StartCommand(
        argv=tuple(start["argv"]),
        user=str(start.get("user") or DEFAULT_USER),
        cwd=start.get("cwd"),
        env=dict(start.get("env") or {}),
        ready_port=start.get("ready_port"),
        ready_timeout=float(start.get("ready_timeout", 60.0)),
        ready_argv=tuple(start["ready_argv"]) if start.get("ready_argv") else None,
    )


def start_of(chain: Sequence[ImageMeta]) -> StartCommand | None:
    """The start command of the topmost image in ``chain`` that has one."""
    return next((m.start for m in chain if m.start is not None), None)


def workdir_of(chain: Sequence[ImageMeta]) -> str | None:
    """The working directory of processes that name none: the topmost image's that sets
    one (a snapshot keeps its template's)."""
    return next((m.workdir for m in chain if m.workdir), None)


def env_of(chain: Sequence[ImageMeta]) -> dict[str, str]:
    """The images' environment, the top layer's values winning."""
    env: dict[str, str] = {}
    for meta in reversed(chain):
        env.update(meta.env)
    return env


def host_binds_of(chain: Sequence[ImageMeta]) -> list[str]:
    """The host directories the chain's images bind into their sandboxes (each at the same
    path in the guest), top layer's first: one list for every launcher."""
    return [b for meta in chain for b in meta.host_binds]
