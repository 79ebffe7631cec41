"""Sandbox networking in the local runtime: the rules compiler and the plumbing
(network.py), nftables (nft.py), the egress proxy for domain names (egress.py), a socket
made in a sandbox's namespace (netns.py), the host's own addresses (hostaddrs.py) and the
registry of runtime roots on the host (roots.py)."""
