"""Nodes: the hosts a service's sandboxes live on, and the one place the apps ask which
host holds a sandbox (or a volume) and for the runtime that acts there (docs/ARCHITECTURE.md,
"Nodes: where a fleet layer sits"). :mod:`nodes.selectors` is the seam."""
