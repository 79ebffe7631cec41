"""Who a pulled image is shared with: the cache (and the runtime image made of an entry) is
keyed by where the image was pulled from and its digest, and by the team for a pull with
credentials. A team that serves another team's manifest bytes from a registry of its own,
without the blobs, gets nothing of the other's private image."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from templates.builds.images import image_id_for
from templates.builds.registry import PullFailed, RegistryAuth, pull
from tests.templates.conftest import REGISTRY_PASSWORD, REGISTRY_USER

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def _manifest_only(manifest: bytes, media_type: str, digest: str) -> type[BaseHTTPRequestHandler]:
    class ManifestOnly(BaseHTTPRequestHandler):
        """A registry that serves one manifest under every name and has no blob at all."""

        def do_GET(self) -> None:
            if self.path == "/v2/":
                self._send(200, b"{}", "application/json")
            elif "/manifests/" in self.path:
                self._send(200, manifest, media_type)
            else:
                self._send(404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}', "application/json")

        do_HEAD = do_GET

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if body is manifest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return ManifestOnly


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_team_without_credentials_never_gets_a_private_image_by_serving_its_manifest(
    private_registry_url: str, pull_cache: Path
) -> None:
    auth = RegistryAuth(REGISTRY_USER, REGISTRY_PASSWORD)
    private = pull(
        "debian:bookworm", auth=auth, mirror=private_registry_url, cache_dir=pull_cache, team_id=1
    )
    answer = httpx.get(
        f"{private_registry_url}/v2/library/debian/manifests/{private.digest}",
        auth=(REGISTRY_USER, REGISTRY_PASSWORD),
        headers={"Accept": ACCEPT},
        trust_env=False,
    )
    answer.raise_for_status()
    # Team 2's own registry: team 1's manifest, byte for byte (so the same digest), and none
    # of the layers it names.
    handler = _manifest_only(answer.content, answer.headers["content-type"], private.digest)
    with _serving(handler) as port:
        with pytest.raises(PullFailed):
            got = pull(
                "team2/lookalike:1",
                auth=None,
                mirror=f"http://127.0.0.1:{port}",
                cache_dir=pull_cache,
                team_id=2,
            )
            assert got.rootfs != private.rootfs, "team 2 got team 1's private files"
    # Another team with credentials of its own pulls for itself: its own entry and image.
    other = pull(
        "debian:bookworm", auth=auth, mirror=private_registry_url, cache_dir=pull_cache, team_id=3
    )
    assert other.digest == private.digest and not other.cached
    assert other.rootfs != private.rootfs
    assert image_id_for(other) != image_id_for(private)
    again = pull(
        "debian:bookworm", auth=auth, mirror=private_registry_url, cache_dir=pull_cache, team_id=1
    )
    assert again.cached and again.rootfs == private.rootfs
    assert image_id_for(again) == image_id_for(private)
