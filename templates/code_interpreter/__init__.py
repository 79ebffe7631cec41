"""The ``code-interpreter-v1`` template (see build.py)."""

from templates.code_interpreter.build import (
    ALIAS,
    CPU_COUNT,
    DISK_MB,
    MEMORY_MB,
    BuildFailed,
    Built,
    build,
    image_id,
)

__all__ = [
    "ALIAS",
    "CPU_COUNT",
    "DISK_MB",
    "MEMORY_MB",
    "BuildFailed",
    "Built",
    "build",
    "image_id",
]
