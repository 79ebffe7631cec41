from django.urls import path, re_path

from templates.builds.views import BuildViewSet as B
from templates.builds.views import OperatorBuildViewSet as Op
from templates.builds.views import TagViewSet as T
from templates.builds.views import UploadView
from templates.views import TemplateViewSet as V

# Template ids in paths may hold '/' and ':' (snapshot names, ``name:tag``; the Python SDK
# sends them as %2F and %3A, which arrive decoded), so the routes that end in a fixed word
# are matched before the catch-all.
ID = r"(?P<template_id>.+)"
BUILD = r"(?P<build_id>[^/]+)"

urlpatterns = [
    path("templates", V.as_view({"get": "list", "post": "v1_refused"})),
    path("v3/templates", B.as_view({"post": "request_build"})),
    path("v2/templates", V.as_view({"get": "list_v2", "post": "v1_refused"})),
    # E2B's operator route (the admin token): matched before the admin site's /admin/.
    path("admin/teams/<str:team_id>/builds/cancel", Op.as_view({"post": "cancel_team"})),
    path("templates/tags", T.as_view({"post": "assign", "delete": "remove"})),
    path("templates/aliases/<str:alias>", V.as_view({"get": "alias"})),
    path("templates/uploads/<str:team_id>/<str:files_hash>", UploadView.as_view()),
    re_path(rf"^v2/templates/{ID}/builds/{BUILD}$", B.as_view({"post": "trigger"})),
    re_path(rf"^v2/templates/{ID}$", V.as_view({"patch": "publish_v2"})),
    re_path(rf"^templates/{ID}/builds/{BUILD}/status$", B.as_view({"get": "build_status"})),
    re_path(rf"^templates/{ID}/builds/{BUILD}/logs$", B.as_view({"get": "build_logs"})),
    re_path(rf"^templates/{ID}/builds/{BUILD}$", B.as_view({"post": "v1_refused"})),
    re_path(rf"^templates/{ID}/files/(?P<files_hash>[^/]+)$", B.as_view({"get": "file_link"})),
    re_path(rf"^templates/{ID}/tags/count$", T.as_view({"get": "count"})),
    re_path(rf"^templates/{ID}/tags/exists$", T.as_view({"get": "exists"})),
    re_path(rf"^templates/{ID}/tags/groups$", T.as_view({"get": "groups"})),
    re_path(
        rf"^templates/{ID}/tags/(?P<tag>[^/]+)/assignments$", T.as_view({"get": "assignments"})
    ),
    re_path(rf"^templates/{ID}/tags$", T.as_view({"get": "listed"})),
    # <path:>: snapshot names may hold '/' and ':'.
    path(
        "templates/<path:template_id>",
        V.as_view(
            {"get": "retrieve", "delete": "destroy", "post": "v1_refused", "patch": "publish"}
        ),
    ),
]
