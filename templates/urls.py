from django.urls import path

from templates.views import TemplateViewSet as V

urlpatterns = [
    path("templates", V.as_view({"get": "list"})),
    path("templates/aliases/<str:alias>", V.as_view({"get": "alias"})),
    # <path:>: snapshot names may hold '/' and ':' (the SDK sends them as %2F and %3A,
    # which arrive decoded).
    path("templates/<path:template_id>", V.as_view({"get": "retrieve", "delete": "destroy"})),
]
