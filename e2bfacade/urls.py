"""Root URLconf. E2B paths carry no prefix, so every app's routes are mounted at the root."""

from __future__ import annotations

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from e2bfacade.views import HealthView, PlacementView, ReadinessView, metrics

# Django's own errors (unknown route, DisallowedHost, an unhandled exception) in E2B's
# `{code, message}` shape: the SDKs parse the body before they look at the status.
handler400 = "e2bfacade.errors.handler400"
handler403 = "e2bfacade.errors.handler403"
handler404 = "e2bfacade.errors.handler404"
handler500 = "e2bfacade.errors.handler500"

urlpatterns: list[URLPattern | URLResolver] = [
    path("health", HealthView.as_view(), name="health"),
    path("health/ready", ReadinessView.as_view(), name="health-ready"),
    path("health/placement", PlacementView.as_view(), name="health-placement"),
    path("metrics", metrics, name="metrics"),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi"), name="docs"),
    path("", include("sandboxes.urls")),
    path("", include("snapshots.urls")),
    path("", include("templates.urls")),
    path("", include("e2bfacade.keys.urls")),
    # Last: E2B's operator routes (/admin/teams/{teamID}/…, /admin/sandboxes/running-counts,
    # in the apps' urls above) are matched first. Neither shadows the other: the admin
    # site's pages end in '/', and its app and model names hold no '-' and no "teams" app.
    path("admin/", admin.site.urls),
]
