from django.urls import path

from snapshots.views import SnapshotViewSet as V

urlpatterns = [
    path("sandboxes/<str:sandbox_id>/snapshots", V.as_view({"post": "create"})),
    path("sandboxes/<str:sandbox_id>/fork", V.as_view({"post": "fork"})),
    path("snapshots", V.as_view({"get": "list"})),
]
