"""URLs of the recipes API (mounted at /api/v1/ beside the clusters API)."""

from django.urls import path

from . import views

CLUSTER = "projects/<slug:project>/clusters/<slug:cluster>/"
MODEL = "projects/<slug:project>/models/<slug:name>/"
ENDPOINT = "projects/<slug:project>/endpoints/<slug:name>/"

urlpatterns = [
    path("recipes/", views.RecipeList.as_view(), name="api-recipes"),
    path("projects/<slug:project>/models/", views.ModelVersionList.as_view(), name="api-models"),
    path(MODEL, views.ModelDetail.as_view(), name="api-model"),
    path(MODEL + "versions/<int:version>/", views.VersionDetail.as_view(), name="api-model-version"),
    path(MODEL + "aliases/<str:alias>/", views.Alias.as_view(), name="api-model-alias"),
    path("projects/<slug:project>/endpoints/", views.EndpointList.as_view(), name="api-endpoints"),
    path(ENDPOINT, views.EndpointDetail.as_view(), name="api-endpoint"),
    path(ENDPOINT + "metrics/", views.EndpointMetrics.as_view(), name="api-endpoint-metrics"),
    path(CLUSTER + "runs/", views.RunList.as_view(), name="api-runs"),
    path(CLUSTER + "runs/<uuid:run>/", views.RunDetail.as_view(), name="api-run"),
    path(CLUSTER + "runs/<uuid:run>/cancel/", views.RunCancel.as_view(), name="api-run-cancel"),
    path(CLUSTER + "runs/<uuid:run>/register/", views.RunRegister.as_view(), name="api-run-register"),
]
