"""Benchmarks: scripts run as ``python bench/<name>.py`` (see the README, "Performance")."""
