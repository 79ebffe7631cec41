"""Workload identity (E2B's ``iam``): this service is an OIDC issuer. A sandbox created
with ``iam.tokens`` gets short-lived JWTs (subject: its team and itself; audience: the one
asked for) that only the egress proxy ever holds, written into requests through
``${e2b.identity.tokens.<name>}`` placeholders — a cloud provider configured to trust the
issuer can exchange them for credentials. ``keys.py`` the signing keys and their rotation,
``tokens.py`` minting, ``views.py`` the discovery document and the JWKS."""
