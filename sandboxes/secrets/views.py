"""Secret routes (E2B's control API, ``X-API-KEY``): validate, call one service, render.
No response carries a value (``SecretSerializer`` has no field for one).

Retry behaviour: GET is safe; ``POST /secrets`` is not idempotent (a retry of a create
whose answer was lost gets a 409 naming the secret; read it by name); ``POST
/secrets/{id}`` appends a version each time (a retry makes one more, of the same value);
DELETE is idempotent in effect (a retry answers 404). None honours Idempotency-Key: a
stored request would hold the value."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from e2bfacade.requests import json_body, team_of
from e2bfacade.schema import errors
from sandboxes.secrets import selectors, services
from sandboxes.secrets.serializers import (
    NewSecretSerializer,
    SecretListQuerySerializer,
    SecretSerializer,
    SecretUpdateSerializer,
)


class SecretViewSet(viewsets.ViewSet):
    lookup_field = "secret_id"

    @extend_schema(
        operation_id="getSecrets",
        parameters=[SecretListQuerySerializer],
        responses={200: SecretSerializer(many=True), **errors(400)},
    )
    def list(self, request: Request) -> Response:
        query = SecretListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        rows, token = selectors.secret_list(
            team_id=team_of(request).pk,
            limit=query.validated_data["limit"],
            next_token=query.validated_data.get("nextToken"),
        )
        headers = {"X-Next-Token": token} if token else None
        data = SecretSerializer(rows, many=True).data  # type: ignore[arg-type]  # stubs: many=True
        return Response(data, headers=headers)

    @extend_schema(
        operation_id="postSecrets",
        request=NewSecretSerializer,
        responses={201: SecretSerializer, **errors(400, 409)},
    )
    def create(self, request: Request) -> Response:
        body = NewSecretSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        secret = services.secret_create(
            team=team_of(request),
            name=body.validated_data["name"],
            value=body.validated_data["value"],
            metadata=body.validated_data.get("metadata"),
        )
        return Response(SecretSerializer(secret).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="getSecretsSecretID", responses={200: SecretSerializer, **errors(404)}
    )
    def retrieve(self, request: Request, secret_id: str) -> Response:
        secret = selectors.secret_get(team_id=team_of(request).pk, selector=secret_id)
        return Response(SecretSerializer(secret).data)

    @extend_schema(
        operation_id="postSecretsSecretID",
        request=SecretUpdateSerializer,
        responses={200: SecretSerializer, **errors(400, 404)},
    )
    def update(self, request: Request, secret_id: str) -> Response:
        body = SecretUpdateSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        secret = services.secret_update(
            team=team_of(request),
            selector=secret_id,
            value=body.validated_data["value"],
            metadata=body.validated_data.get("metadata"),
        )
        return Response(SecretSerializer(secret).data)

    @extend_schema(operation_id="deleteSecretsSecretID", responses={204: None, **errors(404)})
    def destroy(self, request: Request, secret_id: str) -> Response:
        services.secret_revoke(team=team_of(request), selector=secret_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
