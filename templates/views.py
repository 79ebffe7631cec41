"""Template routes."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.errors import ApiError, NotFound
from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import errors
from templates import selectors, services
from templates.models import Template
from templates.serializers import (
    TemplateAliasSerializer,
    TemplateListQuerySerializer,
    TemplateSerializer,
    TemplateUpdateResponseSerializer,
    TemplateUpdateSerializer,
    TemplateWithBuildsSerializer,
)


class TemplateViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="listTemplates", responses={200: TemplateSerializer(many=True), **errors()}
    )
    def list(self, request: Request) -> Response:
        rows = selectors.template_list(team_id=team_of(request).pk)
        return Response(TemplateSerializer(rows, many=True).data)  # type: ignore[arg-type]  # stubs don't model many=True

    @extend_schema(
        operation_id="listTemplatesV2",
        parameters=[TemplateListQuerySerializer],
        responses={
            200: TemplateSerializer(many=True),
            **errors(400, 404),
        },
    )
    def list_v2(self, request: Request) -> Response:
        """E2B's paged list (``nextToken``, ``limit`` up to 100, ``X-Next-Token``).
        ``teamID``, when given, must be the caller's team: another team's is a 404."""
        query = TemplateListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        q = query.validated_data
        team = team_of(request)
        if q.get("teamID") not in (None, str(team.pk)):
            raise NotFound(f"team '{q['teamID']}' not found")
        rows, token = selectors.template_page(
            team_id=team.pk, limit=q["limit"], next_token=q.get("nextToken")
        )
        headers = {"X-Next-Token": token} if token else {}
        return Response(TemplateSerializer(rows, many=True).data, headers=headers)  # type: ignore[arg-type]  # stubs don't model many=True

    def _publish(self, request: Request, template_id: str) -> Template:
        body = TemplateUpdateSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        return services.template_publish(
            team=team_of(request), ref=template_id, public=body.validated_data.get("public")
        )

    @extend_schema(
        operation_id="updateTemplate",
        request=TemplateUpdateSerializer,
        responses={200: None, **errors(400, 403, 404)},
    )
    def publish(self, request: Request, template_id: str) -> Response:
        """``PATCH /templates/{id}`` (E2B's v1): 200 with no body."""
        self._publish(request, template_id)
        return Response(status=status.HTTP_200_OK)

    @extend_schema(
        operation_id="updateTemplateV2",
        request=TemplateUpdateSerializer,
        responses={
            200: TemplateUpdateResponseSerializer,
            **errors(400, 403, 404),
        },
    )
    def publish_v2(self, request: Request, template_id: str) -> Response:
        """``PATCH /v2/templates/{id}``: what ``e2b template publish``/``unpublish`` call."""
        template = self._publish(request, template_id)
        return Response({"names": template.names})

    @extend_schema(
        operation_id="getTemplate", responses={200: TemplateWithBuildsSerializer, **errors(404)}
    )
    def retrieve(self, request: Request, template_id: str) -> Response:
        found = Template.objects.resolve(team_of(request).pk, template_id)
        if found is None or found.kind == Template.Kind.FORK:
            raise NotFound(f"template '{template_id}' not found")
        template = selectors.with_stats(Template.objects.filter(pk=found.pk)).get()
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
        return Response({"templateID": template.template_id, "public": template.is_public})
