"""COPY steps' archives: ``GET /templates/{id}/files/{hash}`` answers whether the team has
the archive and a signed upload URL on this service; the ``PUT`` to it streams the body to
a temporary file and renames it into place (two concurrent uploads of one hash are safe).
Archives are kept per team by the SDK's files hash, so a team's templates share them."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlencode

from django.conf import settings
from django.db import IntegrityError

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


def present(team: Team, files_hash: str) -> bool:
    return (
        BuildFile.objects.filter(team=team, files_hash=files_hash).exists()
        and path_of(team.pk, files_hash).is_file()
    )


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
