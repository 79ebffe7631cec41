"""Guest accounts, read from the guest's own /etc/passwd and /etc/group (files the guest
writes: bounded in size, ids checked against the sandbox's range before any host thread or
guest process takes them), and the mapping of guest ids to the host ids of the sandbox's
range.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from e2bfacade.runtime.base import GuestFileError, UnknownUser
from e2bfacade.runtime.local.guest.syscalls import openat2

# The guest's account files are read to resolve names; a larger one is refused, not read.
MAX_ACCOUNT_FILE = 1 << 20


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def _read_small(root_fd: int, path: str) -> str:
    try:
        fd = openat2(root_fd, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except GuestFileError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ACCOUNT_FILE:
            return ""
        return os.read(fd, MAX_ACCOUNT_FILE).decode(errors="replace")
    finally:
        os.close(fd)


def _table(root_fd: int, path: str) -> list[list[str]]:
    return [line.split(":") for line in _read_small(root_fd, path).splitlines()]


GUEST_IDS = 65536  # a sandbox's ids: guest 0..65535 are host id_base..id_base + 65535


def _decimal(text: str) -> int | None:
    """An id as the account files write it (ASCII digits only: ``int`` would also take
    ``"٣"`` and ``" 7"``), or None."""
    return int(text) if text.isascii() and text.isdigit() else None


def lookup_user(root_fd: int, name: str) -> Account:
    """The guest account ``name`` from the guest's own /etc/passwd. The guest writes that
    file: an account whose uid or gid is outside the sandbox's ids (0..65535) is refused
    here, before any host thread or guest process could take it."""
    for row in _table(root_fd, "/etc/passwd"):
        if len(row) < 6 or row[0] != name:
            continue
        uid, gid = _decimal(row[2]), _decimal(row[3])
        if uid is None or gid is None:
            continue
        if not (0 <= uid < GUEST_IDS and 0 <= gid < GUEST_IDS):
            raise UnknownUser(
                errno.EINVAL,
                f"user {name!r} has ids {uid}:{gid}, outside the sandbox's 0..{GUEST_IDS - 1}",
            )
        return Account(name, uid, gid, row[5] or "/")
    if name == "root":  # uid 0 is root whatever the guest's files say (a bare rootfs has none)
        return Account("root", 0, 0, "/root")
    raise UnknownUser(errno.ENOENT, f"user {name!r} does not exist in the sandbox")


def _names_of(root_fd: int, path: str) -> dict[int, str]:
    names = {}
    for row in _table(root_fd, path):
        number = _decimal(row[2]) if len(row) > 2 else None
        if number is not None:
            names[number] = row[0]
    return names


def id_names(root_fd: int) -> tuple[dict[int, str], dict[int, str]]:
    return _names_of(root_fd, "/etc/passwd"), _names_of(root_fd, "/etc/group")


def host_id(id_base: int, guest_id: int) -> int:
    """The host id of a guest id of the sandbox whose range starts at ``id_base``. Never
    one outside that range: a thread that took it would act as another sandbox's, or as
    the host's (setfsuid takes 32 bits: a passwd uid of 2**32 - id_base is host root)."""
    if not 0 <= guest_id < GUEST_IDS:
        raise UnknownUser(errno.EINVAL, f"id {guest_id} is outside the sandbox's ids")
    return id_base + guest_id


def name_of(names: dict[int, str], guest_id: int) -> str:
    """A guest id's name; an id outside the guest's range is nobody's, as inside."""
    if not 0 <= guest_id < 65536:
        guest_id = 65534
    return names.get(guest_id, str(guest_id))
