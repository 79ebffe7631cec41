"""E2B's template names: ``[namespace/]name[:tag]``, lowercased; a tag matches
``^[a-z0-9-_.]+$`` and is no UUID; ``default`` is the tag a plain name means."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from e2bfacade.errors import BadRequest
from templates.models import DEFAULT_TAG

NAME = re.compile(r"^[a-z0-9][a-z0-9-_]*$")
TAG = re.compile(r"^[a-z0-9-_.]+$")
MAX_TAGS = 32


@dataclass(frozen=True)
class Name:
    name: str
    tag: str | None  # None: no tag given (``default``)

    @property
    def tag_or_default(self) -> str:
        return self.tag or DEFAULT_TAG


def check_tag(tag: str) -> str:
    tag = tag.strip().lower()
    if not TAG.match(tag) or len(tag) > 128 or _is_uuid(tag):
        raise BadRequest(f"Invalid tag: '{tag}' must match {TAG.pattern} and not be a UUID")
    return tag


def parse(value: object, *, what: str = "name") -> Name:
    """A ``name[:tag]`` as E2B parses it (a namespace, when given, is dropped: this
    service has one namespace per team)."""
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("Name is required")
    text = value.strip().lower()
    name, sep, tag = text.partition(":")
    if "/" in name:
        name = name.rsplit("/", 1)[1]
    if not NAME.match(name) or len(name) > 128:
        raise BadRequest(f"Invalid {what}: '{value}' must match {NAME.pattern}[:tag]")
    if sep and not tag:
        raise BadRequest(f"Invalid tag: '{value}' has an empty tag")
    parsed_tag = check_tag(tag) if sep else None
    return Name(name, None if parsed_tag == DEFAULT_TAG else parsed_tag)


def tags(values: Iterable[object], *, first: str | None = None) -> list[str]:
    """Validated, deduplicated tags in the order given, ``first`` leading."""
    out: list[str] = []
    for value in ([first] if first else []) + list(values):
        if not isinstance(value, str):
            raise BadRequest("Invalid tag: tags are strings")
        tag = check_tag(value)
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise BadRequest(f"Invalid tags: at most {MAX_TAGS} tags")
    return out


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
