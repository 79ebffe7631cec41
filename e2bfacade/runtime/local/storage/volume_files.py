"""The content of a volume, as the content API reaches it from the host."""

from __future__ import annotations

from pathlib import Path


class LocalVolumeFiles:
    def __init__(self, root: Path) -> None:
        self.root = root
