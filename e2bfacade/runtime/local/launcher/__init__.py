"""The launcher: sandboxd (the C daemon that makes each sandbox's namespaces, root and init,
and reaps it), how it is built, and the runtime's client of it."""
