"""``filesystem.Filesystem``: envd's file service over the runtime's file operations.

Paths are resolved inside the guest (the runtime's business), relative ones and ``~`` under
the caller's home. An entry is reported as envd reports it: a symlink with the type and
mode of what it points at, ``isSymlink`` set and its absolute target; ``mode`` is the
permission bits only and ``permissions`` Go's ``FileMode.String()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import posixpath
import stat
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as pb
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from e2bfacade.runtime.base import (
    EntryInfo,
    FileType,
    FsChange,
    FsEvent,
    GuestFileError,
    SandboxRuntimeError,
)
from e2bfacade.runtime.guest import Guest
from sandboxes.dataplane import streams
from sandboxes.dataplane.process import keepalive_interval, rpc, rpc_error
from sandboxes.dataplane.target import Caller, current

if TYPE_CHECKING:
    from connectrpc.request import RequestContext

FILE_TYPES = {
    FileType.FILE: pb.FileType.FILE,
    FileType.DIRECTORY: pb.FileType.DIRECTORY,
    FileType.SYMLINK: pb.FileType.SYMLINK,
}
MAX_LINK_HOPS = 8
EVENT_TYPES = {
    FsChange.CREATE: pb.EventType.CREATE,
    FsChange.WRITE: pb.EventType.WRITE,
    FsChange.REMOVE: pb.EventType.REMOVE,
    FsChange.RENAME: pb.EventType.RENAME,
    FsChange.CHMOD: pb.EventType.CHMOD,
}


def permissions(mode: int) -> str:
    """Go's ``os.FileMode.String()`` of a file: ``-rw-r--r--``, ``drwxr-xr-x``,
    ``Lrwxrwxrwx``."""
    kind = "d" if stat.S_ISDIR(mode) else "L" if stat.S_ISLNK(mode) else "-"
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return kind + bits


def _followed(guest: Guest, user: str | None, entry: EntryInfo) -> tuple[EntryInfo | None, str]:
    """What a symlink points at (None when it dangles or loops) and its absolute target."""
    target = posixpath.normpath(
        posixpath.join(posixpath.dirname(entry.path), entry.symlink_target or "")
    )
    seen = entry
    for _ in range(MAX_LINK_HOPS):
        try:
            seen = guest.stat(target, user=user)
        except GuestFileError:
            return None, target
        if seen.type is not FileType.SYMLINK:
            return seen, target
        target = posixpath.normpath(
            posixpath.join(posixpath.dirname(seen.path), seen.symlink_target or "")
        )
    return None, target


def entry_info(guest: Guest, user: str | None, entry: EntryInfo) -> pb.EntryInfo:
    """Blocking (a symlink's target is looked up): call on a thread."""
    shown, target, link = entry, None, entry.type is FileType.SYMLINK
    if link:
        followed, target = _followed(guest, user, entry)
        shown = followed if followed is not None else entry
    kind = FILE_TYPES.get(shown.type, pb.FileType.UNSPECIFIED)
    if link and shown is entry:
        kind = pb.FileType.UNSPECIFIED  # a dangling link: the SDK's list drops these
    seconds = int(entry.modified_time)
    return pb.EntryInfo(
        name=entry.name,
        type=kind,
        path=entry.path,
        size=shown.size,
        mode=shown.mode & 0o777,
        permissions=permissions(entry.mode),
        owner=entry.owner,
        group=entry.group,
        modified_time=Timestamp(seconds=seconds, nanos=int((entry.modified_time - seconds) * 1e9)),
        symlink_target=target,
        metadata=dict(shown.metadata) or None,
        # Not set: envd (0.6.x) has no isSymlink; the SDK would report a link as a link
        # instead of as what it points at, as E2B's sandboxes do.
    )


def _stat_info(guest: Guest, user: str | None, path: str) -> pb.EntryInfo:
    return entry_info(guest, user, guest.stat(path, user=user))


def fs_event(caller: Caller, root: str, change: FsEvent, include_entry: bool) -> pb.FilesystemEvent:
    """Blocking (with ``include_entry``, the entry is looked up): call on a thread. The
    entry comes with creates, writes and chmods, when the file is still there, as in envd.
    (No network mounts are ever watched here: ``allowNetworkMounts`` changes nothing.)"""
    entry = None
    if include_entry and change.change in (FsChange.CREATE, FsChange.WRITE, FsChange.CHMOD):
        with contextlib.suppress(SandboxRuntimeError):
            entry = _stat_info(caller.guest, caller.user, posixpath.join(root, change.name))
    return pb.FilesystemEvent(name=change.name, type=EVENT_TYPES[change.change], entry=entry)


class FilesystemService:
    """The ``filesystem.Filesystem`` service of the caller's sandbox."""

    async def stat(
        self, request: pb.StatRequest, ctx: RequestContext[object, object]
    ) -> pb.StatResponse:
        caller = current.get()
        entry = await rpc(_stat_info, caller.guest, caller.user, request.path)
        return pb.StatResponse(entry=entry)

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[object, object]
    ) -> pb.MakeDirResponse:
        caller = current.get()
        guest, user = caller.guest, caller.user
        try:
            made = await streams.call(guest.make_dir, request.path, user=user)
            entry = await streams.call(_stat_info, guest, user, request.path)
        except GuestFileError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTDIR):  # a file is in the way
                raise ConnectError(
                    Code.INVALID_ARGUMENT, f"path '{request.path}' exists and is not a directory"
                ) from None
            raise rpc_error(exc) from None
        except SandboxRuntimeError as exc:
            raise rpc_error(exc) from None
        if not made:
            raise ConnectError(Code.ALREADY_EXISTS, f"directory '{request.path}' already exists")
        return pb.MakeDirResponse(entry=entry)

    async def move(
        self, request: pb.MoveRequest, ctx: RequestContext[object, object]
    ) -> pb.MoveResponse:
        caller = current.get()
        guest, user = caller.guest, caller.user
        moved = await rpc(guest.move, request.source, request.destination, user=user)
        entry = await rpc(entry_info, guest, user, moved)
        return pb.MoveResponse(entry=entry)

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[object, object]
    ) -> pb.ListDirResponse:
        caller = current.get()
        guest, user = caller.guest, caller.user
        depth = request.depth or 1

        def listed() -> list[pb.EntryInfo]:
            entry = guest.stat(request.path, user=user)
            if entry.type is FileType.SYMLINK:
                followed, _ = _followed(guest, user, entry)
                if followed is None:
                    raise GuestFileError(
                        errno.ELOOP, f"path '{request.path}' is a broken or cyclic link"
                    )
                entry = followed
            if entry.type is not FileType.DIRECTORY:
                raise GuestFileError(errno.ENOTDIR, f"path '{request.path}' is not a directory")
            return [
                entry_info(guest, user, e)
                for e in guest.list_dir(request.path, user=user, depth=depth)
            ]

        entries = await rpc(listed)
        return pb.ListDirResponse(entries=entries)

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[object, object]
    ) -> pb.RemoveResponse:
        caller = current.get()
        await rpc(caller.guest.remove, request.path, user=caller.user)
        return pb.RemoveResponse()

    # Watchers: kept by the sandbox's agent (a sync watcher outlives this process).
    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[object, object]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        caller = current.get()
        watch = await rpc(
            caller.guest.watch_dir,
            request.path,
            recursive=bool(request.recursive),
            user=caller.user,
        )
        yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))  # type: ignore[arg-type]
        interval = keepalive_interval(ctx)
        changes = streams.pump(iter(watch), close=watch.close).__aiter__()
        try:
            while True:
                try:
                    change = await asyncio.wait_for(anext(changes), interval)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    keep = pb.WatchDirResponse.KeepAlive()
                    yield pb.WatchDirResponse(event=Oneof("keepalive", keep))  # type: ignore[arg-type]
                    continue
                event = await streams.call(
                    fs_event, caller, request.path, change, bool(request.include_entry)
                )
                yield pb.WatchDirResponse(event=Oneof("filesystem", event))  # type: ignore[arg-type]
        finally:
            await changes.aclose()  # type: ignore[attr-defined]
            watch.close()

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[object, object]
    ) -> pb.CreateWatcherResponse:
        caller = current.get()
        watcher_id = await rpc(
            caller.guest.create_watcher,
            request.path,
            recursive=bool(request.recursive),
            user=caller.user,
            include_entry=bool(request.include_entry),
        )
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[object, object]
    ) -> pb.GetWatcherEventsResponse:
        caller = current.get()
        changes = await rpc(caller.guest.watcher_events, request.watcher_id)
        events = await streams.call(
            lambda: [
                fs_event(caller, changes.path, c, changes.include_entry) for c in changes.events
            ]
        )
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[object, object]
    ) -> pb.RemoveWatcherResponse:
        caller = current.get()
        await rpc(caller.guest.remove_watcher, request.watcher_id)
        return pb.RemoveWatcherResponse()
