"""What the host writes into a new sandbox's own layer before its guest first runs — never
after: once the guest has run, what is in its layer is the guest's (a cold boot finds what
the guest left there)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2bfacade.runtime.local.storage import disks

CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"


def resolv_conf(sandbox_dir: Path, owner: int, servers: Sequence[str]) -> None:
    """The guest's resolvers (as E2B's templates have 8.8.8.8)."""
    data = "".join(f"nameserver {ip}\n" for ip in servers).encode()
    _write(sandbox_dir, owner, "etc/resolv.conf", data)


def trust(
    sandbox_dir: Path, owner: int, chain: Sequence[dict[str, Any]], layer_root: Any, extra: str
) -> None:
    """The image's CA bundle (from the top layer that has one) plus the extra CAs."""
    base = b""
    for meta in chain:  # the top layer first
        path = layer_root(meta["id"]) / CA_BUNDLE
        if path.is_file() and not path.is_symlink():
            base = path.read_bytes()
            break
    _write(sandbox_dir, owner, CA_BUNDLE, base + b"\n" + Path(extra).read_bytes())


def _write(sandbox_dir: Path, owner: int, relative: str, data: bytes) -> None:
    """A file (0644) of guest root's, with its parent directories (0755)."""
    target = sandbox_dir / disks.MOUNT / "upper"
    parts = Path(relative).parts
    for part in parts[:-1]:
        target = target / part
        target.mkdir(mode=0o755, exist_ok=True)
        os.chown(target, owner, owner)
    out = target / parts[-1]
    out.write_bytes(data)
    os.chown(out, owner, owner)
    out.chmod(0o644)
