"""The data plane: what the E2B SDKs send to a sandbox itself (envd's API, see
ENVD_CONTRACT in the README's references): Connect RPCs for processes and files, ``/files``
uploads and downloads, ``/health``, and requests for other ports forwarded into the sandbox.

An ASGI application (``app.py``) served by uvicorn, apart from the control plane's WSGI
workers: its calls stream both ways and last as long as the commands they follow. It reaches
sandboxes only through the runtime interface, reads nothing from the database (a sandbox's
access token, default user and env vars come with the runtime's status of it) and holds no
state of its own: a command belongs to its sandbox, so any data-plane process can serve it
and restarting them all loses nothing.
"""
