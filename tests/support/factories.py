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


# --- sandboxes and templates (appended for tests/api) ---------------------------------
# Imported here, not at the top, so this section can be appended without touching the rest.
from datetime import timedelta  # noqa: E402

from django.utils import timezone  # noqa: E402

from sandboxes.models import Sandbox  # noqa: E402
from templates.models import Template  # noqa: E402


class TemplateFactory(DjangoModelFactory[Template]):
    """A team's template. Its runtime image is ``base`` by default, so a sandbox started
    from it really runs on the local runtime."""

    class Meta:
        model = Template

    template_id = factory.Sequence(lambda n: f"tpl{n:017d}")
    team = factory.SubFactory(TeamFactory)
    alias = factory.Sequence(lambda n: f"template-{n}")
    kind = Template.Kind.TEMPLATE
    image_id = "base"


class SandboxFactory(DjangoModelFactory[Sandbox]):
    """A sandbox row only: nothing runs in the runtime. Use it for reads (lists, filters,
    tenancy); drive the runtime through the API instead."""

    class Meta:
        model = Sandbox

    team = factory.SubFactory(TeamFactory)
    template = factory.SubFactory(TemplateFactory, team=factory.SelfAttribute("..team"))
    alias = factory.LazyAttribute(lambda o: o.template.alias or "")
    state = Sandbox.State.RUNNING
    started_at = factory.LazyFunction(timezone.now)
    state_changed_at = factory.LazyAttribute(lambda o: o.started_at)
    end_at = factory.LazyAttribute(lambda o: o.started_at + timedelta(seconds=300))
    cpu_count = 2
    memory_mb = 512
    disk_size_mb = 1024
    envd_version = "0.2.4"
