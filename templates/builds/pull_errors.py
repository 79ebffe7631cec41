"""skopeo's failures in the user's words (:mod:`.registry`): always a message of ours, never
skopeo's text, which may quote what a registry — or a redirect's target — answered. skopeo's
own words go to the service's log."""

from __future__ import annotations

# Every way a connection can fail, from the namespace (refused: nothing listens) or from the
# proxy (its one SOCKS reply): one message, whatever the target was.
UNREACHABLE_SIGNS = (
    "socks connect",
    "connection refused",
    "connection reset",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "dial tcp",
    "tls handshake timeout",
    ": eof",
)
TLS_SIGNS = ("x509:", "tls:", "certificate")


def explain(ref: str, stderr: str, *, with_credentials: bool) -> str:
    """skopeo's failure in the user's words: a message of ours, never skopeo's text (it may
    quote a registry's answer); nothing of the credentials in it. Reachability is decided
    first, so nothing a refused target could say changes the message."""
    said = stderr.lower()
    if any(s in said for s in UNREACHABLE_SIGNS):
        return f"the registry for {ref!r} is unreachable"
    if "server gave http response to https client" in said:
        return f"the registry serves plain HTTP: cannot pull {ref!r} over HTTPS"
    if any(s in said for s in TLS_SIGNS):
        return f"the registry for {ref!r} is unreachable over verified HTTPS"
    if "unauthorized" in said or "authentication required" in said or "denied" in said:
        if with_credentials:
            return f"the registry refused the credentials given for {ref!r}"
        if "authentication required" in said:
            return f"the registry requires credentials to pull {ref!r} (fromImageRegistry)"
        # Docker Hub answers "denied" for a repository that does not exist, too.
        return (
            f"the registry refused to serve {ref!r}: it does not exist there, or it needs "
            "credentials (fromImageRegistry)"
        )
    if "manifest unknown" in said or "name unknown" in said or "not found" in said:
        return f"image {ref!r} was not found in the registry"
    if "no image found in manifest list for architecture" in said:
        return f"image {ref!r} has no variant for this machine's architecture"
    return f"the registry's answer for {ref!r} could not be used (the server's log has details)"
