"""Template builds. ``registry`` gets an OCI image from a registry into a root file system
and a runtime image; ``debian`` makes the Debian images this service provides for E2B's
base names and pushes them to a registry (``manage.py seed_registry``)."""
