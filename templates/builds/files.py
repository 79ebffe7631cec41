"""COPY steps' archives: ``GET /templates/{id}/files/{hash}`` answers whether the team has
the archive and a single-use signed upload URL on this service; the ``PUT`` to it is
claimed (the signature, the team's quota and the service's bounds checked, its size
reserved) before its body is read, then streamed to a temporary file renamed into place
(two concurrent uploads of one hash are safe). Archives are kept per team by the SDK's
files hash, so a team's templates share them. The files hash is the client's word only: a
build keys its cache on the archive's own digest too (:func:`pin`)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlencode

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from e2bfacade.errors import ApiError, AtCapacity, BadRequest, ServiceUnavailable
from e2bfacade.models import Team
from templates.models import BuildFile, UploadClaim

HASH = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


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
    found = BuildFile.objects.filter(team=team, files_hash=files_hash).update(
        created_at=timezone.now()
    )
    return bool(found) and path_of(team.pk, files_hash).is_file()


def _signature(team_id: int, files_hash: str, expires: int, nonce: str) -> str:
    message = f"template-upload:{team_id}:{files_hash}:{expires}:{nonce}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def upload_url(base: str, team: Team, files_hash: str) -> str:
    """A URL that lets its holder (the SDK's upload client, which sends no API key) put this
    one archive for this team, once, until it expires. The nonce makes every URL a new one
    (two asked for in the same second would otherwise be the same, and the second unusable
    once the first is used)."""
    expires = int(time.time()) + settings.TEMPLATE_UPLOAD_URL_SECONDS
    nonce = secrets.token_hex(8)
    signature = _signature(team.pk, files_hash, expires, nonce)
    query = urlencode({"expires": expires, "nonce": nonce, "signature": signature})
    return f"{base}/templates/uploads/{team.pk}/{files_hash}?{query}"


# --------------------------------------------------------------------------- uploads
# An upload is claimed, then written. The claim checks the URL and reserves the body's
# declared size before a byte of it is read (a refusal reads nothing, stores nothing and
# leaves the URL unused); the write streams the body into the team's directory and records
# it, or gives the reservation back. The data plane serves uploads behind the front
# (sandboxes/dataplane/template_uploads.py); UploadView does when gunicorn is alone.


class UploadRefused(ApiError):
    status = 403


class UploadTooLarge(ApiError):
    status = 413


class LengthRequired(ApiError):
    status = 411


class UploadTimedOut(ApiError):
    status = 408


@dataclass(frozen=True)
class Upload:
    """A claimed upload (its row, :class:`UploadClaim`): ``size`` bytes reserved, to arrive
    by ``deadline`` (seconds since the epoch)."""

    claim_id: int
    team_id: int
    files_hash: str
    size: int
    deadline: float


# The transaction-scoped advisory lock every claim takes on PostgreSQL ("e2bu", 1): the
# bounds are sums over rows, which no row lock or constraint guards, so claims take turns
# for the few milliseconds of their check and insert. (SQLite's IMMEDIATE transactions
# already take turns.) Apart from the idempotency records' namespace ("e2bf").
_CLAIM_LOCK = (0x65326275 << 32) | 1


def upload_claim(
    *, team_id: int, files_hash: str, query: Mapping[str, str], length: int | None
) -> Upload:
    """Check a PUT to an upload URL and reserve what its body declares, before any of the
    body is read.

    Refusals, in this order, each reserving nothing and leaving the URL unused: 403 (a
    signature that does not verify, an expired URL), 411 (no Content-Length), 413 (past
    TEMPLATE_FILE_MAX_MB, or the team's archives and uploads in flight past
    TEMPLATE_FILES_MAX_MB_PER_TEAM), 429 (the team's TEMPLATE_UPLOADS_PER_TEAM in flight),
    503 with Retry-After (the service's TEMPLATE_UPLOADS_IN_FLIGHT or _MB in flight), and
    403 for a URL used already: the claim's unique signature decides, so of two concurrent
    PUTs of one URL exactly one is claimed."""
    check_hash(files_hash)
    expires, nonce = query.get("expires", ""), query.get("nonce", "")
    signature = query.get("signature", "")
    if not expires.isdigit() or not hmac.compare_digest(
        _signature(team_id, files_hash, int(expires), nonce), signature
    ):
        raise UploadRefused("the upload URL's signature is not valid")
    now = timezone.now()
    if int(expires) < now.timestamp():
        raise UploadRefused("the upload URL has expired; ask for a new one")
    if length is None:
        raise LengthRequired("an upload needs a Content-Length header")
    file_max = settings.TEMPLATE_FILE_MAX_MB << 20
    if length > file_max:
        raise UploadTooLarge(
            f"the archive exceeds the limit of {settings.TEMPLATE_FILE_MAX_MB} MiB"
        )
    deadline = now + timedelta(seconds=settings.TEMPLATE_UPLOAD_SECONDS)
    try:
        with transaction.atomic():
            _take_claim_lock()
            _check_bounds(team_id, files_hash, length, now)
            claim = UploadClaim.objects.create(
                team_id=team_id,
                files_hash=files_hash,
                signature=signature,
                size_bytes=length,
                deadline=deadline,
                url_expires_at=datetime.fromtimestamp(int(expires), tz=UTC),
            )
    except IntegrityError:
        if not Team.objects.filter(pk=team_id).exists():
            raise UploadRefused("the upload URL's team no longer exists") from None
        raise UploadRefused(
            "this upload URL has already been used: an upload URL is good for one upload; "
            "ask for a new one"
        ) from None
    return Upload(claim.pk, team_id, files_hash, length, deadline.timestamp())


def _take_claim_lock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CLAIM_LOCK])


def _check_bounds(team_id: int, files_hash: str, length: int, now: datetime) -> None:
    """The caller holds the claim lock. An archive of the same hash is replaced, so it does
    not count; in-flight claims past their deadline are dead and count for nothing."""
    kept = (
        BuildFile.objects.filter(team_id=team_id)
        .exclude(files_hash=files_hash)
        .aggregate(total=Sum("size_bytes"))["total"]
        or 0
    )
    live = UploadClaim.objects.filter(state=UploadClaim.State.IN_FLIGHT, deadline__gt=now)
    team = live.filter(team_id=team_id).aggregate(n=Count("pk"), total=Sum("size_bytes"))
    if kept + (team["total"] or 0) + length > settings.TEMPLATE_FILES_MAX_MB_PER_TEAM << 20:
        raise UploadTooLarge(
            f"the team's archives would exceed {settings.TEMPLATE_FILES_MAX_MB_PER_TEAM} MiB "
            "(TEMPLATE_FILES_MAX_MB_PER_TEAM, uploads in progress included); unused ones are "
            f"removed after {settings.TEMPLATE_FILES_KEEP_DAYS} days"
        )
    if team["n"] >= settings.TEMPLATE_UPLOADS_PER_TEAM:
        raise AtCapacity(
            f"the team has {team['n']} uploads in progress, its limit "
            "(TEMPLATE_UPLOADS_PER_TEAM); retry when one has finished"
        )
    every = live.aggregate(n=Count("pk"), total=Sum("size_bytes"))
    if (
        every["n"] >= settings.TEMPLATE_UPLOADS_IN_FLIGHT
        or (every["total"] or 0) + length > settings.TEMPLATE_UPLOADS_IN_FLIGHT_MB << 20
    ):
        raise ServiceUnavailable(
            "too many uploads are in progress on this service; retry shortly",
            headers={"Retry-After": "5"},
        )


def upload_write(upload: Upload, chunks: Iterable[bytes]) -> int:
    """Stream ``chunks`` (the claimed body) into the team's archive of the files hash;
    returns its size. The body goes to a temporary file beside the archive and is renamed
    over it whole (two concurrent uploads of one hash leave one of them intact); a body
    longer or shorter than declared, or still arriving at the deadline, leaves nothing.
    Either way the claim ends: recorded as stored, or its reservation given back."""
    target = path_of(upload.team_id, upload.files_hash)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > upload.size:
                    raise BadRequest(f"the body is longer than its {upload.size} bytes")
                if time.time() > upload.deadline:
                    raise upload_timed_out()
                out.write(chunk)
        if size != upload.size:
            raise BadRequest(f"the body ended after {size} of {upload.size} bytes")
        os.replace(tmp, target)
    except BaseException:
        _end_claim(upload, stored=False)
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _end_claim(upload, stored=True)
    return size


def store_own(team_id: int, files_hash: str, body: Readable, size: int) -> None:
    """Put an archive the service made itself (a template of its own, e.g.
    ``code-interpreter-v1``) in the team's store, as an upload would leave it: written
    whole beside the archive and renamed over it, then recorded. No URL, claim or quota:
    no client is in the way, and the caller bounds what it writes."""
    target = path_of(team_id, files_hash)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".own-")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks_of(body, size):
                out.write(chunk)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    BuildFile.objects.update_or_create(
        team_id=team_id,
        files_hash=files_hash,
        defaults={"size_bytes": size, "created_at": timezone.now()},
    )


def upload_timed_out() -> UploadTimedOut:
    return UploadTimedOut(
        f"the upload did not arrive within {settings.TEMPLATE_UPLOAD_SECONDS} s "
        "(TEMPLATE_UPLOAD_SECONDS)"
    )


def _end_claim(upload: Upload, *, stored: bool) -> None:
    """Stored: the archive's row takes over the reservation, in one transaction, so the
    team's total never counts it twice or not at all. Failed: the reservation is given back
    (the URL stays used). Under the claim lock: a claim sums the archives, then the claims
    in flight, and must not see this one in neither sum between the two."""
    state = UploadClaim.State.STORED if stored else UploadClaim.State.FAILED
    with transaction.atomic():
        _take_claim_lock()
        UploadClaim.objects.filter(pk=upload.claim_id).update(state=state)
        if stored:
            BuildFile.objects.update_or_create(
                team_id=upload.team_id,
                files_hash=upload.files_hash,
                defaults={"size_bytes": upload.size, "created_at": timezone.now()},
            )


def chunks_of(body: Readable, length: int) -> Iterator[bytes]:
    """``length`` bytes of ``body`` in pieces of at most :data:`CHUNK`."""
    left = length
    while left > 0:
        chunk = body.read(min(CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def sweep(now: float | None = None) -> list[str]:
    """Remove archives no build in progress needs and none uploaded or used within
    TEMPLATE_FILES_KEEP_DAYS (a rebuild then uploads them again); returns their hashes.
    Also forgets the claims of expired upload URLs (their signatures refuse them anyway)
    and removes partial bodies a killed process left behind."""
    from templates.models import BuildStatus, TemplateBuild

    checked = timezone.now()
    cutoff = checked - timedelta(days=settings.TEMPLATE_FILES_KEEP_DAYS)
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
    UploadClaim.objects.filter(url_expires_at__lt=checked, deadline__lt=checked).delete()
    # A live upload's partial body is younger than its deadline.
    stale = checked.timestamp() - settings.TEMPLATE_UPLOAD_SECONDS - 60
    for partial in Path(settings.TEMPLATE_FILES_DIR).glob("*/.upload-*"):
        with contextlib.suppress(FileNotFoundError):
            if partial.stat().st_mtime < stale:
                partial.unlink()
    return removed
