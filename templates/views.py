"""Template routes."""

from __future__ import annotations

from django.db.models import Count, Max, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.errors import ApiError, NotFound
from e2bfacade.requests import team_of
from e2bfacade.schema import errors
from templates import services
from templates.models import Template
from templates.serializers import (
    TemplateAliasSerializer,
    TemplateSerializer,
    TemplateWithBuildsSerializer,
)


def _with_stats(qs: QuerySet[Template]) -> QuerySet[Template]:
    return qs.annotate(spawn_count=Count("sandboxes"), last_spawned_at=Max("sandboxes__started_at"))


class TemplateViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="listTemplates", responses={200: TemplateSerializer(many=True), **errors()}
    )
    def list(self, request: Request) -> Response:
        qs = Template.objects.visible_to(team_of(request).pk).filter(kind=Template.Kind.TEMPLATE)
        return Response(TemplateSerializer(_with_stats(qs).order_by("created_at"), many=True).data)  # type: ignore[arg-type]  # stubs don't model many=True

    @extend_schema(
        operation_id="getTemplate", responses={200: TemplateWithBuildsSerializer, **errors(404)}
    )
    def retrieve(self, request: Request, template_id: str) -> Response:
        found = Template.objects.resolve(team_of(request).pk, template_id)
        if found is None or found.kind == Template.Kind.FORK:
            raise NotFound(f"template '{template_id}' not found")
        template = _with_stats(Template.objects.filter(pk=found.pk)).get()
        return Response(TemplateWithBuildsSerializer(template).data)

    @extend_schema(operation_id="templateV1BuildRefused", responses={**errors(400)})
    def v1_refused(self, request: Request, **kwargs: object) -> Response:
        """E2B's v1 builds (``POST /templates``, ``POST /templates/{id}``) need a registry
        that receives pushes; this service builds through the v2 protocol only."""
        from templates.builds.views import V1_REFUSED

        raise ApiError(V1_REFUSED, status=400)

    @extend_schema(operation_id="deleteTemplate", responses={204: None, **errors(400, 403, 404)})
    def destroy(self, request: Request, template_id: str) -> Response:
        services.template_delete(team=team_of(request), ref=template_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="getTemplateAlias",
        responses={200: TemplateAliasSerializer, **errors(403, 404)},
    )
    def alias(self, request: Request, alias: str) -> Response:
        """200 when the alias names a template the team can use; 403 when another team owns
        it; 404 when it is free."""
        team = team_of(request)
        template = (
            Template.objects.visible_to(team.pk).filter(alias=alias).order_by("team_id").first()
        )
        if template is None:
            if Template.objects.filter(alias=alias).exists():
                raise ApiError(f"alias '{alias}' belongs to another team", status=403)
            raise NotFound(f"alias '{alias}' not found")
        return Response({"templateID": template.template_id, "public": template.team_id is None})
