"""The sandbox runtime: the ground floor every app stands on, and the only code that touches
sandboxes. Django-free by rule (``tests/test_architecture.py`` checks it): drivers are
plain Python over the host's kernel or an orchestrator's API, so they can be tested, reused
and reasoned about without settings, models or requests.

- :mod:`.base` — the host's half of the interface (``Runtime``), re-exporting the rest of
  the interface: :mod:`.errors`, :mod:`.specs` (ids, specs, infos, states, capabilities,
  the types both halves use), :mod:`.policy`, :mod:`.measures`.
- :mod:`.guest` — the guest's half (``Guest``, from ``Runtime.guest``) and its types:
  processes, files, watchers, ports.
- :mod:`.volumes` — volumes (``VolumeRuntime``, for a driver with ``VOLUME_MOUNTS``).
- :mod:`.registry` — drivers by name (``SANDBOX_RUNTIME``).
- :mod:`.local` — the ``local`` driver: Linux namespaces, overlayfs and cgroups on this host.

The Django side reaches a runtime only through :func:`e2bfacade.sandbox_runtime.get_runtime`.
See docs/ARCHITECTURE.md, "The runtime seam".
"""
