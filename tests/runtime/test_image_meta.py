"""Image metadata, typed (e2bfacade/runtime/local/storage/image_meta.py), reads every
image.json a host has on disk — the shapes earlier code wrote — and writes the same keys
back."""

from __future__ import annotations

import json

from e2bfacade.runtime.base import StartCommand
from e2bfacade.runtime.local.storage.image_meta import (
    ImageMeta,
    env_of,
    host_binds_of,
    start_of,
    workdir_of,
)

# image.json files as the runtime wrote them before the metadata was typed.
OLD_BASE = {"parent": None, "host_binds": ["/usr", "/lib"], "size": 42, "created": 1.5}
OLD_TEMPLATE = {
    "parent": "base",
    "host_binds": [],
    "env": {"A": "1", "PATH": "/t"},
    "start": {
        "argv": ["sleep", "9"],
        "user": "root",
        "cwd": "/srv",
        "env": {"X": "y"},
        "ready_port": 8080,
        "ready_timeout": 5.0,
        "ready_argv": ["true"],
    },
    "workdir": "/srv",
    "size": 7,
    "xattrs": "user",
    "created": 2.0,
}
OLD_SNAPSHOT = {"parent": "tpl", "host_binds": [], "memory": True, "size": 1, "created": 3.0}
BEFORE_XATTRS: dict[str, object] = {
    "parent": None,
    "host_binds": [],
}  # an image made before sizes and times


def test_old_image_json_files_read_as_typed_entries() -> None:
    base = ImageMeta.from_json("base", OLD_BASE)
    tpl = ImageMeta.from_json("tpl", OLD_TEMPLATE)
    snap = ImageMeta.from_json("snap", OLD_SNAPSHOT)
    bare = ImageMeta.from_json("bare", BEFORE_XATTRS)
    assert base == ImageMeta("base", host_binds=("/usr", "/lib"), size=42, created=1.5)
    assert tpl.start == StartCommand(
        argv=("sleep", "9"),
        user="root",
        cwd="/srv",
        env={"X": "y"},
        ready_port=8080,
        ready_timeout=5.0,
        ready_argv=("true",),
    )
    assert (tpl.parent, tpl.workdir, tpl.xattrs, dict(tpl.env)) == (
        "base",
        "/srv",
        "user",
        {"A": "1", "PATH": "/t"},
    )
    assert snap.memory and not tpl.memory and snap.parent == "tpl"
    assert bare == ImageMeta("bare")

    chain = [snap, tpl, base]  # top first
    assert start_of(chain) == tpl.start
    assert workdir_of(chain) == "/srv"
    assert env_of([ImageMeta("top", env={"A": "2"}), *chain]) == {"A": "2", "PATH": "/t"}
    assert host_binds_of(chain) == ["/usr", "/lib"]


def test_an_entry_writes_back_the_keys_it_was_read_from() -> None:
    for data in (OLD_BASE, OLD_TEMPLATE, OLD_SNAPSHOT):
        written = json.loads(json.dumps(ImageMeta.from_json("x", data).to_json()))
        assert written == data
