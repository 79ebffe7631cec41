"""The data plane: what the E2B SDKs send to a sandbox itself (envd's API, see
docs/dataplane.md, "Data plane"): Connect RPCs for processes and files, ``/files`` uploads
and downloads, ``/health``, and requests for other ports forwarded into the sandbox.

An ASGI application (``app.py``) served by uvicorn, apart from the control plane's WSGI
workers: its calls stream both ways and last as long as the commands they follow. It reaches
sandboxes only through the runtime interface (a sandbox's access token, default user and env
vars come with the runtime's status of it), reads the database only for a sandbox's team
(once per sandbox and worker) and for ``autoResume`` (a paused sandbox), and holds no state
of its own: a command belongs to its sandbox, so any data-plane process can serve it
and restarting them all loses nothing.
"""
