"""Benchmarks: scripts run as ``python bench/<name>.py`` (docs/performance.md, "Performance")."""
