"""``manage.py import_template``: a rootfs tarball becomes a template, or nothing at all."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from e2bfacade.runtime.local import LocalRuntime
from templates.models import Template


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def add_node(tar: tarfile.TarFile, name: str, kind: bytes, major: int, minor: int) -> None:
    node = tarfile.TarInfo(name)
    node.type = kind
    node.devmajor, node.devminor = major, minor
    node.mode = 0o666
    tar.addfile(node)


def leftovers(runtime: LocalRuntime) -> tuple[list[str], list[str]]:
    """The images (published or half-built) and import spools in the runtime's root."""
    return sorted(os.listdir(runtime.root / "images")), sorted(
        n for n in os.listdir(runtime.root / "run") if n.startswith(".import-")
    )


@pytest.mark.parametrize(
    ("kind", "major", "minor", "said"),
    [
        (tarfile.CHRTYPE, 1, 3, "'dev/null' is a character device (1, 3)"),
        (tarfile.BLKTYPE, 8, 0, "'dev/null' is a block device (8, 0)"),
        (tarfile.FIFOTYPE, 0, 0, "'dev/null' is a FIFO"),
    ],
    ids=["char device", "block device", "fifo"],
)
def test_import_template_refuses_a_device_node_naming_it_and_makes_no_template_or_image(
    runtime: LocalRuntime, tmp_path: Path, kind: bytes, major: int, minor: int, said: str
) -> None:
    archive = tmp_path / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "etc/hostname", b"tiny\n")
        add_node(tar, "dev/null", kind, major, minor)
        add_file(tar, "usr/after", b"a member after the node\n")
    name = f"dev-{uuid.uuid4().hex[:8]}"
    templates, before = Template.objects.count(), leftovers(runtime)

    with pytest.raises(CommandError) as refused:
        call_command("import_template", name, str(archive))

    assert said in str(refused.value)
    assert "tar --exclude='./dev/*'" in str(refused.value)
    assert not Template.objects.filter(alias=name).exists()
    assert Template.objects.count() == templates
    assert leftovers(runtime) == before


def test_import_template_gives_the_default_user_a_home_from_the_images_skel(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    archive = tmp_path / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file(tar, "etc/skel/.bashrc", b"# skel\n")
    name = f"skel-{uuid.uuid4().hex[:8]}"

    call_command("import_template", name, str(archive))

    template = Template.objects.get(alias=name)
    rootfs = runtime.root / "images" / template.image_id / "rootfs"
    assert (rootfs / "etc/passwd").read_text().splitlines()[-1] == (
        "user:x:1000:1000:user:/home/user:/bin/sh"
    )
    home, bashrc = (rootfs / "home/user").stat(), (rootfs / "home/user/.bashrc").stat()
    assert (home.st_uid, home.st_gid, bashrc.st_uid, bashrc.st_gid) == (1000, 1000, 1000, 1000)
    assert (rootfs / "home/user/.bashrc").read_bytes() == b"# skel\n"
