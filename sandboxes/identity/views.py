"""The issuer's public documents, unauthenticated as OIDC has them: the discovery document
(``/.well-known/openid-configuration``) and the JWKS (``/.well-known/jwks.json``). Both are
safe to retry and cacheable for a few minutes."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from sandboxes.identity.keys import jwks, signing_key


def issuer_of(request: Request) -> str:
    """The issuer URL: ``E2B_PUBLIC_API_URL``, else the base URL the request came to."""
    return settings.E2B_PUBLIC_API_URL or f"{request.scheme}://{request.get_host()}"


@extend_schema(exclude=True)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def discovery(request: Request) -> Response:
    issuer = issuer_of(request)
    return Response(
        {
            "issuer": issuer,
            "jwks_uri": f"{issuer}/.well-known/jwks.json",
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "nbf", "jti"],
        },
        headers={"Cache-Control": "public, max-age=300"},
    )


@extend_schema(exclude=True)
@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def jwk_set(request: Request) -> Response:
    signing_key()  # so that the key the next token is signed with is already listed
    return Response(jwks(), headers={"Cache-Control": "public, max-age=300"})
