"""Routes of a team's keys and tokens (E2B's paths, at the root)."""

from django.urls import path

from e2bfacade.keys import views as v

urlpatterns = [
    path("teams", v.TeamsView.as_view()),
    path("api-keys", v.ApiKeysView.as_view()),
    path("api-keys/<str:api_key_id>", v.ApiKeyView.as_view()),
    path("access-tokens", v.AccessTokensView.as_view()),
    path("access-tokens/<str:access_token_id>", v.AccessTokenView.as_view()),
    path("admin/teams/<str:team_id>/api-keys", v.AdminApiKeysView.as_view()),
    path("admin/teams/<str:team_id>/api-keys/<str:api_key_id>", v.AdminApiKeyView.as_view()),
]
