"""The local driver's on-disk state: where things live under ``SANDBOX_ROOT``, per-id locks,
and the few facts about host processes the driver keeps (an init is identified by its pid
*and* its kernel start time, so a recycled pid is never mistaken for a live sandbox).

Layout::

    images/<id>/rootfs        a read-only lower layer (template or snapshot)
    images/<id>/image.json    {"parent": <id>|null, "host_binds": [...], "size": n}
    sandboxes/<id>/upper      the sandbox's writable layer
    sandboxes/<id>/state.json written last: its presence means "created"
    locks/<kind>-<nn>.lock    per-id serialisation across threads and processes
    run/sandboxd-*.sock       the launcher/reaper daemon (see sandboxd.c)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from e2bfacade.runtime.base import check_id

LOCK_STRIPES = 256


def proc_starttime(pid: int) -> int | None:
    """The kernel start time of ``pid``: with the pid it identifies a process uniquely."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Layout:
    """Paths and locks under one ``SANDBOX_ROOT``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("images", "sandboxes", "locks", "run", "bin"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        os.chmod(root / "images", 0o700)
        os.chmod(root / "sandboxes", 0o700)

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.root / "sandboxes" / check_id(sandbox_id, "sandbox id")

    def image_dir(self, image_id: str) -> Path:
        return self.root / "images" / check_id(image_id, "image id")

    def sandbox_ids(self) -> set[str]:
        """Every sandbox directory's id, made or half-made."""
        return {p.name for p in (self.root / "sandboxes").iterdir() if not p.name.startswith(".")}

    def read_state(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.sandbox_dir(sandbox_id) / "state.json").read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def locked(self, kind: str, ident: str, blocking: bool = True) -> Iterator[bool]:
        """Serialise operations on one id across threads and processes (flock on a striped
        file; each call opens its own descriptor, so threads exclude each other too)."""
        # One file set per kind: a sandbox lock may be held while an image lock is taken
        # (snapshot), and two stripes of one file would deadlock on each other.
        stripe = zlib.crc32(ident.encode()) % LOCK_STRIPES
        with open(self.root / "locks" / f"{kind}-{stripe:03d}.lock", "w") as f:
            flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
            try:
                fcntl.flock(f, flags)
            except BlockingIOError:
                yield False
                return
            yield True
