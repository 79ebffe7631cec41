"""The default user of an imported image: its account and its home, as ``useradd -m``
makes them, when the image's tarball lacks them.

Made at import, in the image itself, as ``base`` gets them at build: every sandbox of the
image then finds them in its read-only lower layer, and none carries a copy of ``/etc/skel``
in its own layer (nor so in its snapshots). The tarball's own account and home win: an
image that has ``user`` keeps its ids and its home as they are.

The tree is the one just extracted and nothing else writes it; no path here is followed
through a symlink of the archive's (they point into the guest's tree, not the host's).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from e2bfacade.runtime.base import DEFAULT_USER, CreateRefused
from e2bfacade.runtime.local.guest.accounts import GUEST_IDS, MAX_ACCOUNT_FILE

USER_ID = 1000  # as in base and E2B's templates; the next free id if the image took it
LAST_ID = 60000  # useradd's UID_MAX


def ensure_default_user(rootfs: Path) -> None:
    """Give ``rootfs`` an account ``user`` (if its /etc/passwd has none) and that
    account's home (if missing): owned by the user, filled from the image's /etc/skel."""
    etc = _directory(rootfs, "etc")
    passwd = _table(etc / "passwd")
    row = next((r for r in passwd if len(r) >= 6 and r[0] == DEFAULT_USER), None)
    if row is None:
        uid, gid, home = _add_account(rootfs, etc, passwd)
    else:
        uid, gid, home = _own_id(row[2]), _own_id(row[3]), row[5]
    if not home.startswith("/") or home.rstrip("/") == "":
        return  # an account the image made homeless on purpose
    relative = Path(home.strip("/"))
    if any(part in (".", "..") for part in relative.parts):
        raise CreateRefused(f"the archive's {DEFAULT_USER!r} has the home {home!r}")
    _make_home(rootfs, relative, uid, gid)


def _add_account(rootfs: Path, etc: Path, passwd: list[list[str]]) -> tuple[int, int, str]:
    group = _table(etc / "group")
    uid = _free(_taken(passwd))
    own_group = next((r for r in group if len(r) > 2 and r[0] == DEFAULT_USER), None)
    if own_group is not None:
        gid = _own_id(own_group[2])
    else:
        taken = _taken(group)
        gid = uid if uid not in taken else _free(taken)
        _append(etc / "group", "root:x:0:\n", f"{DEFAULT_USER}:x:{gid}:\n")
    shell = (
        "/bin/bash" if _inside(rootfs, "bin/bash") or _inside(rootfs, "usr/bin/bash") else "/bin/sh"
    )
    home = f"/home/{DEFAULT_USER}"
    _append(
        etc / "passwd",
        "root:x:0:0:root:/root:/bin/sh\n",
        f"{DEFAULT_USER}:x:{uid}:{gid}:{DEFAULT_USER}:{home}:{shell}\n",
    )
    if _inside(rootfs, "etc/shadow") is not None and not any(
        r[0] == DEFAULT_USER for r in _table(etc / "shadow")
    ):
        _append(etc / "shadow", "", f"{DEFAULT_USER}:*:19000:0:99999:7:::\n")
    return uid, gid, home


def _make_home(rootfs: Path, home: Path, uid: int, gid: int) -> None:
    parent = rootfs
    for part in home.parts[:-1]:
        parent = parent / part
        if parent.is_symlink() or (os.path.lexists(parent) and not parent.is_dir()):
            raise CreateRefused(f"/{home.parent} in the archive is not a directory")
        if not parent.exists():
            parent.mkdir(mode=0o755)
    target = parent / home.name
    if os.path.lexists(target):
        return  # the image's own home, as the image made it
    skel = _inside(rootfs, "etc/skel")
    if skel is not None and skel.is_dir():
        shutil.copytree(skel, target, symlinks=True, ignore=_not_plain)
    else:
        target.mkdir()
    os.chmod(target, 0o755)
    for top, dirs, files in os.walk(target):
        os.chown(top, uid, gid)
        for name in dirs + files:
            os.lchown(os.path.join(top, name), uid, gid)


def _not_plain(directory: str, names: list[str]) -> set[str]:
    """Of /etc/skel, only directories, regular files and symlinks are copied (an overlay
    whiteout is no file of the user's)."""
    kept = (stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK)
    return {
        n for n in names if not any(k(os.lstat(os.path.join(directory, n)).st_mode) for k in kept)
    }


def _inside(rootfs: Path, relative: str) -> Path | None:
    """``rootfs/relative`` if it exists and no directory on the way is a symlink (the last
    component may be one only if it is itself what is asked: it is returned unfollowed)."""
    path = rootfs
    parts = Path(relative).parts
    for i, part in enumerate(parts):
        path = path / part
        if not os.path.lexists(path):
            return None
        if path.is_symlink() and i < len(parts) - 1:
            return None
    return None if path.is_symlink() else path


def _directory(rootfs: Path, name: str) -> Path:
    path = rootfs / name
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        raise CreateRefused(f"/{name} in the archive is not a directory")
    path.mkdir(mode=0o755, exist_ok=True)
    return path


def _table(path: Path) -> list[list[str]]:
    if not os.path.lexists(path):
        return []
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise CreateRefused(f"/etc/{path.name} in the archive is not a regular file")
    if st.st_size > MAX_ACCOUNT_FILE:
        raise CreateRefused(f"/etc/{path.name} in the archive is over {MAX_ACCOUNT_FILE} bytes")
    return [line.split(":") for line in path.read_text(errors="replace").splitlines()]


def _own_id(text: str) -> int:
    """An id of the image's own ``user`` (or its group): one the sandbox can map."""
    if not (text.isascii() and text.isdigit()) or int(text) >= GUEST_IDS:
        raise CreateRefused(f"the archive's {DEFAULT_USER!r} has the id {text!r}")
    return int(text)


def _taken(rows: list[list[str]]) -> set[int]:
    return {int(r[2]) for r in rows if len(r) > 2 and r[2].isascii() and r[2].isdigit()}


def _free(taken: set[int]) -> int:
    """USER_ID, else the first id above it no one has (as useradd picks one)."""
    free = next((i for i in range(USER_ID, LAST_ID + 1) if i not in taken), None)
    if free is None:
        raise CreateRefused("the archive's /etc/passwd or /etc/group has no free id")
    return free


def _append(path: Path, header: str, line: str) -> None:
    """Add ``line`` to the account file ``path``; a new file starts with ``header``."""
    if not os.path.lexists(path):
        path.write_text(header + line)
        path.chmod(0o640 if path.name == "shadow" else 0o644)
        return
    text = path.read_text(errors="replace")
    with open(path, "a") as out:
        out.write(("" if text.endswith("\n") or not text else "\n") + line)
