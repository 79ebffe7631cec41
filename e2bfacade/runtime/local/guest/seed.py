"""What the host writes into a new sandbox's own layer before its guest first runs — never
after: once the guest has run, what is in its layer is the guest's (a cold boot finds what
the guest left there)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from e2bfacade.runtime.local.storage import disks

CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
EGRESS_CA = "etc/ssl/certs/e2bfacade-egress-ca.pem"
MAX_BUNDLE = 8 << 20
# certifi's own bundle, where Python images keep it (requests and httpx read it, not the
# system store): extended like the system's when the image has one.
CERTIFI_BUNDLES = (
    "usr/local/lib/python3*/site-packages/certifi/cacert.pem",
    "usr/lib/python3*/site-packages/certifi/cacert.pem",
    "usr/lib/python3/dist-packages/certifi/cacert.pem",
    "opt/*/lib/python3*/site-packages/certifi/cacert.pem",
)
# Under the template's and the create's own: what points the usual TLS stacks at a bundle
# holding the egress proxy's CA (Node adds it to its built-in roots).
TRUST_ENV = {
    "NODE_EXTRA_CA_CERTS": "/" + EGRESS_CA,
    "SSL_CERT_FILE": "/" + CA_BUNDLE,
    "REQUESTS_CA_BUNDLE": "/" + CA_BUNDLE,
}


def resolv_conf(sandbox_dir: Path, owner: int, servers: Sequence[str]) -> None:
    """The guest's resolvers (as E2B's templates have 8.8.8.8)."""
    data = "".join(f"nameserver {ip}\n" for ip in servers).encode()
    _write(sandbox_dir, owner, "etc/resolv.conf", data)


def trust(
    sandbox_dir: Path,
    owner: int,
    layers: Sequence[Path],
    egress_ca: Path,
    extra: str | None,
) -> None:
    """The image's CA bundle (from the top layer of ``layers``, top first, that has one),
    and certifi's if the image has one, plus the egress proxy's CA and the extra CAs; the
    egress CA alone in a file of its own (``NODE_EXTRA_CA_CERTS``)."""
    added = egress_ca.read_bytes() + (b"\n" + Path(extra).read_bytes() if extra else b"")
    _write(sandbox_dir, owner, EGRESS_CA, egress_ca.read_bytes())
    for pattern in (CA_BUNDLE, *CERTIFI_BUNDLES):
        found: list[tuple[Path, Path]] = []  # (layer root, bundle) of the top layer with any
        for root in layers:  # the top layer first
            found = [(root, p) for p in sorted(root.glob(pattern)) if _plain(p)]
            if found:
                break
        if not found and pattern == CA_BUNDLE:
            _write(sandbox_dir, owner, CA_BUNDLE, b"\n" + added)  # no bundle: ours alone
        for root, path in found:
            data = path.read_bytes() + b"\n" + added
            _write(sandbox_dir, owner, str(path.relative_to(root)), data)


def _plain(path: Path) -> bool:
    # A template's files are its owner's: a "bundle" too large to be one is left alone.
    return path.is_file() and not path.is_symlink() and path.stat().st_size < MAX_BUNDLE


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
