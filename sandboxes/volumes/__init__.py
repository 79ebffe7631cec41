"""Volumes: E2B's volume API (control routes on the API, the content API on the data
plane) and their mounts into sandboxes. The storage is the runtime's
(``e2bfacade.runtime.volumes``)."""
