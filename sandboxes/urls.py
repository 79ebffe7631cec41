"""Sandbox, volume and secret routes, at the root as E2B has them (no prefix, no trailing slash)."""

from django.urls import path

from sandboxes.identity import views as identity
from sandboxes.secrets.views import SecretViewSet as Sec
from sandboxes.views import NodeViewSet as Nodes
from sandboxes.views import OperatorViewSet as Op
from sandboxes.views import SandboxViewSet as V
from sandboxes.views import TeamMetricsViewSet as TeamMetrics
from sandboxes.volumes.views import VolumeViewSet as Vol

urlpatterns = [
    path("v2/sandboxes", V.as_view({"post": "create_v2", "get": "list_v2"})),
    path("sandboxes", V.as_view({"post": "create_v1", "get": "list_v1"})),
    # Before sandboxes/<id>: "metrics" is no sandbox's id.
    path("sandboxes/metrics", V.as_view({"get": "batch_metrics"})),
    path("sandboxes/<str:sandbox_id>", V.as_view({"get": "retrieve", "delete": "destroy"})),
    path("v2/sandboxes/<str:sandbox_id>/connect", V.as_view({"post": "connect"})),
    path("sandboxes/<str:sandbox_id>/connect", V.as_view({"post": "connect"})),
    path("sandboxes/<str:sandbox_id>/resume", V.as_view({"post": "resume"})),
    path("sandboxes/<str:sandbox_id>/pause", V.as_view({"post": "pause"})),
    path("sandboxes/<str:sandbox_id>/network", V.as_view({"put": "update_network"})),
    path("sandboxes/<str:sandbox_id>/timeout", V.as_view({"post": "set_timeout"})),
    path("sandboxes/<str:sandbox_id>/refreshes", V.as_view({"post": "refresh"})),
    path("sandboxes/<str:sandbox_id>/metrics", V.as_view({"get": "metrics"})),
    path("sandboxes/<str:sandbox_id>/logs", V.as_view({"get": "logs_v1"})),
    path("v2/sandboxes/<str:sandbox_id>/logs", V.as_view({"get": "logs_v2"})),
    path("teams/<str:team_id>/metrics", TeamMetrics.as_view({"get": "metrics"})),
    path("teams/<str:team_id>/metrics/max", TeamMetrics.as_view({"get": "metrics_max"})),
    # E2B's operator routes (the admin token): matched before the admin site's /admin/.
    path("admin/teams/<str:team_id>/sandboxes/kill", Op.as_view({"post": "kill_team"})),
    path("admin/sandboxes/running-counts", Op.as_view({"get": "running_counts"})),
    path("nodes", Nodes.as_view({"get": "list"})),
    path("nodes/<str:node_id>", Nodes.as_view({"get": "retrieve", "post": "set_status"})),
    path("volumes", Vol.as_view({"post": "create", "get": "list"})),
    path("volumes/<str:volume_id>", Vol.as_view({"get": "retrieve", "delete": "destroy"})),
    path("secrets", Sec.as_view({"get": "list", "post": "create"})),
    path(
        "secrets/<str:secret_id>",
        Sec.as_view({"get": "retrieve", "post": "update", "delete": "destroy"}),
    ),
    path(".well-known/openid-configuration", identity.discovery),
    path(".well-known/jwks.json", identity.jwk_set),
]
