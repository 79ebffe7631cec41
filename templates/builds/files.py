"""COPY steps' archives: ``GET /templates/{id}/files/{hash}`` answers whether the team has
the archive and a signed upload URL on this service; the ``PUT`` to it streams the body to
a temporary file and renames it into place (two concurrent uploads of one hash are safe).
Archives are kept per team by the SDK's files hash, so a team's templates share them. The
files hash is the client's word only: a build keys its cache on the archive's own digest
too (:func:`pin`)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlencode

from django.conf import settings
from django.db import IntegrityError
from django.db.models import Sum

from e2bfacade.errors import ApiError, BadRequest
from e2bfacade.models import Team
from templates.models import BuildFile

HASH = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class UploadRefused(ApiError):
    status = 403


class UploadTooLarge(ApiError):
    status = 413


def check_hash(files_hash: str) -> str:
    if not HASH.match(files_hash):
        raise BadRequest("Invalid files hash")
    return files_hash


def path_of(team_id: int, files_hash: str) -> Path:
    return Path(settings.TEMPLATE_FILES_DIR) / str(team_id) / f"{check_hash(files_hash)}.tar"


@dataclass(frozen=True)
class Pinned:
    """One archive as a build uses it: opened once, with the sha256 of its bytes."""

    file: BinaryIO
    sha256: str

    def close(self) -> None:
        self.file.close()


def pin(team_id: int, files_hash: str) -> Pinned | None:
    """The team's archive of ``files_hash``, opened and hashed; None when it has none.

    The files hash cannot be checked against the archive: the JS SDK's hashes the size of
    each directory on the sender's disk, which no archive records (docs/security.md), so the
    server cannot recompute it. The build binds the digest returned here into its cache
    keys instead, and copies from this open file: an upload that replaces the archive later
    replaces the file's name, not these bytes, so what is copied is what was hashed."""
    if not HASH.match(files_hash):
        return None
    try:
        file = open(path_of(team_id, files_hash), "rb")  # noqa: SIM115 - the Pinned owns it
    except FileNotFoundError:
        return None
    digest = hashlib.sha256()
    while chunk := file.read(CHUNK):
        digest.update(chunk)
    file.seek(0)
    return Pinned(file, digest.hexdigest())


def present(team: Team, files_hash: str) -> bool:
    """Whether the team has the archive; asking for it keeps it (the sweep counts from the
    last upload or ask)."""
    from django.utils import timezone

    found = BuildFile.objects.filter(team=team, files_hash=files_hash).update(
        created_at=timezone.now()
    )
    return bool(found) and path_of(team.pk, files_hash).is_file()


def _signature(team_id: int, files_hash: str, expires: int) -> str:
    message = f"template-upload:{team_id}:{files_hash}:{expires}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def upload_url(base: str, team: Team, files_hash: str) -> str:
    """A URL that lets its holder (the SDK's upload client, which sends no API key) put this
    one archive for this team until it expires."""
    expires = int(time.time()) + settings.TEMPLATE_UPLOAD_URL_SECONDS
    query = urlencode({"expires": expires, "signature": _signature(team.pk, files_hash, expires)})
    return f"{base}/templates/uploads/{team.pk}/{files_hash}?{query}"


def check_upload(team_id: int, files_hash: str, expires: str, signature: str) -> None:
    check_hash(files_hash)
    if not expires.isdigit() or not hmac.compare_digest(
        _signature(team_id, files_hash, int(expires)), signature
    ):
        raise UploadRefused("the upload URL's signature is not valid")
    if int(expires) < time.time():
        raise UploadRefused("the upload URL has expired; ask for a new one")


def store(team_id: int, files_hash: str, body: Readable, length: int | None) -> int:
    """Stream ``body`` into the team's archive of ``files_hash``; returns its size. Bounded
    by TEMPLATE_FILE_MAX_MB; a partial body leaves nothing."""
    limit = settings.TEMPLATE_FILE_MAX_MB << 20
    too_large = f"the archive exceeds the limit of {settings.TEMPLATE_FILE_MAX_MB} MiB"
    kept = (
        BuildFile.objects.filter(team_id=team_id)
        .exclude(files_hash=files_hash)
        .aggregate(total=Sum("size_bytes"))["total"]
        or 0
    )
    room = (settings.TEMPLATE_FILES_MAX_MB_PER_TEAM << 20) - kept
    if room < limit:
        limit = max(room, 0)
        too_large = (
            f"the team's archives would exceed {settings.TEMPLATE_FILES_MAX_MB_PER_TEAM} MiB "
            "(TEMPLATE_FILES_MAX_MB_PER_TEAM); unused ones are removed after "
            f"{settings.TEMPLATE_FILES_KEEP_DAYS} days"
        )
    if length is not None and length > limit:
        raise UploadTooLarge(too_large)
    target = path_of(team_id, files_hash)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while length is None or size < length:
                chunk = body.read(CHUNK if length is None else min(CHUNK, length - size))
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise UploadTooLarge(too_large)
                out.write(chunk)
        if length is not None and size != length:
            raise BadRequest(f"the body ended after {size} of {length} bytes")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:
        BuildFile.objects.update_or_create(
            team_id=team_id, files_hash=files_hash, defaults={"size_bytes": size}
        )
    except IntegrityError:  # a concurrent upload of the same archive recorded it first
        pass
    return size


def sweep(now: float | None = None) -> list[str]:
    """Remove archives no build in progress needs and none uploaded or used within
    TEMPLATE_FILES_KEEP_DAYS (a rebuild then uploads them again); returns their hashes."""
    from django.utils import timezone

    from templates.models import BuildStatus, TemplateBuild

    cutoff = timezone.now() - timedelta(days=settings.TEMPLATE_FILES_KEEP_DAYS)
    needed = set()
    for spec in TemplateBuild.objects.filter(
        status__in=(BuildStatus.WAITING, BuildStatus.BUILDING)
    ).values_list("spec", flat=True):
        for step in (spec or {}).get("steps", []):
            if step.get("filesHash"):
                needed.add(step["filesHash"])
    removed = []
    for row in BuildFile.objects.filter(created_at__lt=cutoff).exclude(files_hash__in=needed):
        path_of(row.team_id, row.files_hash).unlink(missing_ok=True)
        row.delete()
        removed.append(row.files_hash)
    return removed
