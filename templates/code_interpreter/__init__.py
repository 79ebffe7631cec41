"""The ``code-interpreter-v1`` template (see template.py)."""

from templates.code_interpreter.template import (
    ALIAS,
    CPU_COUNT,
    DISK_MB,
    MEMORY_MB,
    BuildFailed,
    archive,
    check_host,
    context,
    definition,
    inputs_digest,
    spec,
)

__all__ = [
    "ALIAS",
    "CPU_COUNT",
    "DISK_MB",
    "MEMORY_MB",
    "BuildFailed",
    "archive",
    "check_host",
    "context",
    "definition",
    "inputs_digest",
    "spec",
]
