"""A pulled image (``registry.pull``) made a runtime image.

The image is a parentless ``ImageBuild``: its layer is a copy of the pulled root file
system, with owners, modes, timestamps and hard links kept, and extended attributes left
behind (as an imported archive's are: an image's own ``security.*`` or overlay attributes
mean nothing, or too much, in a sandbox). Files keep their numeric owners, which the
runtime reads as guest ids (a sandbox maps guest 0..65535 to its own host range). Device
nodes, FIFOs and sockets are left out (a sandbox gets the runtime's /dev), and logged. The
driver finishes the tree as it does an import: its mount points, and the default user's
account and home from the image's /etc/skel when the image has no ``user``.

The image's ``Env`` becomes the image's environment (PATH defaulted as Docker does when
the image sets none); its ``User``, ``WorkingDir``, ``Cmd`` and ``Entrypoint`` are the
build's to use (``Pulled``), not the image's: a template's start command is its own.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from e2bfacade.runtime.base import ImageBuild, ImageInfo, Runtime
from templates.builds.registry import CLEAN_ENV, Pulled, PullFailed, drop_special_files

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COPY_TIMEOUT = 900.0


def image_id_for(pulled: Pulled) -> str:
    """A runtime image id for a pulled image: named by its cache entry (``Pulled.key``), so
    it is shared exactly as the entry is — by every anonymous pull of that image and
    digest, and only by its team for a pull with credentials (a digest alone would let a
    team that serves another's manifest bytes reach the other's private image)."""
    return "pulled-" + pulled.key[:24]


def import_pulled(runtime: Runtime, image_id: str, pulled: Pulled) -> ImageInfo:
    """Make image ``image_id`` of ``pulled`` (an existing image of that id is kept)."""
    env = dict(pulled.env)
    env.setdefault("PATH", DEFAULT_PATH)

    def populate(root: Path) -> None:
        copy_tree(pulled.rootfs, root)
        dropped = drop_special_files(root)
        if dropped:
            log.info("image %s: left out %s", image_id, ", ".join(dropped[:20]))

    return runtime.build_image(
        ImageBuild(image_id=image_id, parent=None, populate=populate, env=env)
    )


def copy_tree(source: Path, dest: Path) -> None:
    """Copy ``source``'s contents into the directory ``dest``, never following a link."""
    try:
        done = subprocess.run(
            [
                "cp",
                "--no-dereference",
                "--recursive",
                "--preserve=mode,ownership,timestamps,links",
                "--reflink=auto",
                "--no-target-directory",
                f"{source}/",
                str(dest),
            ],
            capture_output=True,
            text=True,
            timeout=COPY_TIMEOUT,
            env=CLEAN_ENV,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise PullFailed(f"copying the image's files took over {COPY_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        raise PullFailed(f"cannot copy the image's files: {done.stderr.strip()[-400:]}")
