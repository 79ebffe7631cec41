"""Template builds: E2B's Template SDK v2 protocol (requests, uploads, triggers, status and
logs, tags), the build state machine's writes, and the executor that runs a build's steps
in a sandbox of the runtime's own."""
