"""factory-boy factories for e2bfacade's own models. Build with ``Factory.create(...)``."""

from __future__ import annotations

from typing import Any

import factory
from factory.django import DjangoModelFactory

from e2bfacade.models import ApiKey, Team, api_key_create


class TeamFactory(DjangoModelFactory[Team]):
    class Meta:
        model = Team
        django_get_or_create = ["name"]

    name = factory.Sequence(lambda n: f"team-{n}")


class ApiKeyFactory(DjangoModelFactory[ApiKey]):
    """An ``ApiKey`` made by ``api_key_create``; the raw key is on ``.raw`` (tests only)."""

    class Meta:
        model = ApiKey

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"key-{n}")

    @classmethod
    def _create(cls, model_class: type[ApiKey], *args: Any, **kwargs: Any) -> ApiKey:
        # Through the service, so tests exercise the only way keys are made. The raw key is
        # returned nowhere else, so it rides on the instance for the test to use.
        key, raw = api_key_create(team=kwargs["team"], name=kwargs["name"])
        key.raw = raw  # type: ignore[attr-defined]
        return key
