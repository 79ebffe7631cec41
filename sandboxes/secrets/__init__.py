"""E2B's secrets: a team's write-only values that the egress proxy's transform rules name
(``${e2b.secrets.<name>}``). The control routes in ``views.py``, the writes in
``services.py``, the reads (the proxy's resolution among them) in ``selectors.py``; a
secret's rows are ``sandboxes.models.Secret`` and ``SecretVersion``."""
