"""The sandbox runtime: the ground floor every app stands on, and the only code that touches
sandboxes. Django-free by rule (``tests/runtime/test_contract.py`` checks it): drivers are
plain Python over the host's kernel or an orchestrator's API, so they can be tested, reused
and reasoned about without settings, models or requests.

- :mod:`.base` — the host's half of the interface (``Runtime``): specs, infos, errors,
  capabilities, and the types both halves use.
- :mod:`.guest` — the guest's half (``Guest``, from ``Runtime.guest``): processes, files,
  watchers, ports.
- :mod:`.registry` — drivers by name (``SANDBOX_RUNTIME``).
- :mod:`.local` — the ``local`` driver: Linux namespaces, overlayfs and cgroups on this host.

The Django side reaches a runtime only through :func:`e2bfacade.sandbox_runtime.get_runtime`.
See docs/ARCHITECTURE.md, "The runtime seam".
"""
