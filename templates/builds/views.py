"""The Template SDK's routes: request a build, the COPY files' upload links and uploads,
trigger, status and logs, tags. Answers carry E2B's exact statuses (the Python SDK parses
a body only for the documented one: 202, 201, 202, 200, 201, 204, 200)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from e2bfacade.auth import AdminTokenAuthentication, NoApiKeyHere
from e2bfacade.errors import BadRequest, NotFound
from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import IDEMPOTENCY_KEY, errors
from idempotency import http as idempotency
from templates.builds import files, services, tags
from templates.builds.idempotent import REQUEST_BUILD
from templates.models import Template

V1_REFUSED = (
    "v1 (docker push) builds are not supported; use 'e2b template create' or the Template SDK"
)


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}")
    return value


def _owned_template(request: Request, ref: str) -> Template:
    team = team_of(request)
    template = Template.objects.resolve(team.pk, ref)
    if template is None or template.team_id != team.pk:
        raise NotFound(f"template '{ref}' not found")
    return template


def _base_url(request: Request) -> str:
    from django.conf import settings

    return settings.E2B_PUBLIC_API_URL or f"{request.scheme}://{request.get_host()}"


class BuildViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="postTemplatesV3",
        request=OpenApiTypes.OBJECT,
        parameters=[IDEMPOTENCY_KEY],
        responses={202: OpenApiTypes.OBJECT, **errors(400, 403, 409, 422, 429)},
    )
    def request_build(self, request: Request) -> Any:
        body = services.build_request_body(json_body(request))  # nothing recorded for a 400
        return idempotency.run(
            request, team=team_of(request), route=REQUEST_BUILD, params={}, body=body
        )

    @extend_schema(
        operation_id="getTemplateFiles",
        responses={201: OpenApiTypes.OBJECT, **errors(400, 404)},
    )
    def file_link(self, request: Request, template_id: str, files_hash: str) -> Response:
        _owned_template(request, template_id)
        files.check_hash(files_hash)
        team = team_of(request)
        return Response(
            {
                "present": files.present(team, files_hash),
                "url": files.upload_url(_base_url(request), team, files_hash),
                "headers": {},
            },
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        operation_id="postTemplateBuildV2",
        request=OpenApiTypes.OBJECT,
        responses={202: None, **errors(400, 403)},
    )
    def trigger(self, request: Request, template_id: str, build_id: str) -> Response:
        services.build_trigger(
            team=team_of(request),
            template_ref=template_id,
            build_id=build_id,
            body=json_body(request),
        )
        return Response(status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="getTemplateBuildStatus",
        responses={200: OpenApiTypes.OBJECT, **errors(400, 403)},
    )
    def build_status(self, request: Request, template_id: str, build_id: str) -> Response:
        build = services.resolve_build(
            team=team_of(request), template_ref=template_id, build_id=build_id
        )
        level = request.query_params.get("level") or None
        if level is not None and level not in services.LEVELS:
            raise BadRequest(f"level must be one of {', '.join(services.LEVELS)}")
        offset = _int(request, "logsOffset", 0, 0, 1 << 31)
        limit = _int(request, "limit", services.LOG_PAGE, 0, services.LOG_PAGE)
        return Response(services.build_status(build, offset=offset, limit=limit, level=level))

    @extend_schema(
        operation_id="getTemplateBuildLogs",
        responses={200: OpenApiTypes.OBJECT, **errors(400, 403)},
    )
    def build_logs(self, request: Request, template_id: str, build_id: str) -> Response:
        build = services.resolve_build(
            team=team_of(request), template_ref=template_id, build_id=build_id
        )
        offset = _int(request, "cursor", 0, 0, 1 << 31)
        limit = _int(request, "limit", services.LOG_PAGE, 0, services.LOG_PAGE)
        entries = services.log_entries(build, offset=offset, limit=limit, level=None)
        return Response({"logs": entries})

    @extend_schema(operation_id="templateV1Refused", responses={**errors(400)})
    def v1_refused(self, request: Request, **kwargs: Any) -> Response:
        raise BadRequest(V1_REFUSED)


class TagViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="postTemplatesTags",
        request=OpenApiTypes.OBJECT,
        responses={201: OpenApiTypes.OBJECT, **errors(400, 403, 404)},
    )
    def assign(self, request: Request) -> Response:
        body = json_body(request)
        build, assigned = tags.assign(
            team=team_of(request), target=body.get("target"), tags=body.get("tags")
        )
        return Response(
            {"buildID": str(build.build_id), "tags": assigned}, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        operation_id="deleteTemplatesTags",
        request=OpenApiTypes.OBJECT,
        responses={204: None, **errors(400, 403, 404)},
    )
    def remove(self, request: Request) -> Response:
        body = json_body(request)
        tags.remove(team=team_of(request), name=body.get("name"), tags=body.get("tags"))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="getTemplateTags",
        responses={200: {"type": "array", "items": {"type": "object"}}, **errors(404)},
    )
    def listed(self, request: Request, template_id: str) -> Response:
        return Response(tags.listed(team=team_of(request), ref=template_id))

    @extend_schema(
        operation_id="getTemplateTagsCount", responses={200: OpenApiTypes.OBJECT, **errors(404)}
    )
    def count(self, request: Request, template_id: str) -> Response:
        return Response(tags.count(team=team_of(request), ref=template_id))

    @extend_schema(
        operation_id="getTemplateTagsExists",
        responses={200: OpenApiTypes.OBJECT, **errors(400, 404)},
    )
    def exists(self, request: Request, template_id: str) -> Response:
        tag = request.query_params.get("tag", "")
        return Response(tags.exists(team=team_of(request), ref=template_id, tag=tag))

    @extend_schema(
        operation_id="getTemplateTagsGroups", responses={200: OpenApiTypes.OBJECT, **errors(404)}
    )
    def groups(self, request: Request, template_id: str) -> Response:
        return Response(
            tags.groups(
                team=team_of(request),
                ref=template_id,
                tags_limit=_int(request, "tagsLimit", 100, 1, 100),
                assignment_limit=_int(request, "assignmentLimit", 10, 1, 100),
            )
        )

    @extend_schema(
        operation_id="getTemplateTagAssignments",
        responses={200: OpenApiTypes.OBJECT, **errors(404)},
    )
    def assignments(self, request: Request, template_id: str, tag: str) -> Response:
        return Response(
            tags.assignments(
                team=team_of(request),
                ref=template_id,
                tag=tag,
                limit=_int(request, "limit", 100, 1, 100),
            )
        )


class UploadView(APIView):
    """``PUT`` of a COPY archive to the signed URL ``file_link`` answered: the URL is the
    credential (the SDK's upload client sends no API key), good for one upload.

    Behind the front (``manage.py serve``) these PUTs go to the data plane, which streams
    them without holding a worker (sandboxes/dataplane/template_uploads.py); this view
    serves them when gunicorn runs alone (``--no-front``). Either way the claim comes
    before the first byte of the body is read."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_classes: list[type] = []
    parser_classes: list[type] = []

    @extend_schema(
        operation_id="putTemplateFiles",
        request=OpenApiTypes.BINARY,
        responses={200: None, **errors(400, 403, 408, 411, 413, 429, 503)},
    )
    def put(self, request: Request, team_id: str, files_hash: str) -> Response:
        if not team_id.isdigit():
            raise NotFound("no such upload")
        raw = request.META.get("CONTENT_LENGTH") or ""
        upload = files.upload_claim(
            team_id=int(team_id),
            files_hash=files_hash,
            query=request.query_params,
            length=int(raw) if raw.isdigit() else None,
        )
        files.upload_write(upload, files.chunks_of(request._request, upload.size))
        return Response(status=status.HTTP_200_OK)


class OperatorBuildViewSet(viewsets.ViewSet):
    """``POST /admin/teams/{teamID}/builds/cancel``: the operator's admin token only."""

    authentication_classes = [AdminTokenAuthentication, NoApiKeyHere]

    @extend_schema(
        operation_id="adminCancelTeamBuilds",
        request=None,
        responses={
            200: inline_serializer(
                "AdminBuildCancelResult",
                {
                    "cancelledCount": serializers.IntegerField(),
                    "failedCount": serializers.IntegerField(),
                },
            ),
            **errors(404),
        },
    )
    def cancel_team(self, request: Request, team_id: str) -> Response:
        cancelled, failed = services.builds_cancel_team(team=team_of(request))
        return Response({"cancelledCount": cancelled, "failedCount": failed})
