"""URLs of the recipes APIs: runs, the model registry and endpoints (mounted at /api/v1/ beside the clusters API)."""

from django.urls import path

from .registry import api as registry
from .runs import api as runs
from .serving import api as serving

CLUSTER = "projects/<slug:project>/clusters/<slug:cluster>/"
MODEL = "projects/<slug:project>/models/<slug:name>/"
ENDPOINT = "projects/<slug:project>/endpoints/<slug:name>/"

urlpatterns = [
    path("recipes/", runs.RecipeList.as_view(), name="api-recipes"),
    path("projects/<slug:project>/models/", registry.ModelVersionList.as_view(), name="api-models"),
    path(MODEL, registry.ModelDetail.as_view(), name="api-model"),
    path(MODEL + "versions/<int:version>/", registry.VersionDetail.as_view(), name="api-model-version"),
    path(MODEL + "aliases/<str:alias>/", registry.Alias.as_view(), name="api-model-alias"),
    path("projects/<slug:project>/endpoints/", serving.EndpointList.as_view(), name="api-endpoints"),
    path(ENDPOINT, serving.EndpointDetail.as_view(), name="api-endpoint"),
    path(ENDPOINT + "metrics/", serving.EndpointMetrics.as_view(), name="api-endpoint-metrics"),
    path(CLUSTER + "runs/", runs.RunList.as_view(), name="api-runs"),
    path(CLUSTER + "runs/<uuid:run>/", runs.RunDetail.as_view(), name="api-run"),
    path(CLUSTER + "runs/<uuid:run>/cancel/", runs.RunCancel.as_view(), name="api-run-cancel"),
    path(CLUSTER + "runs/<uuid:run>/register/", runs.RunRegister.as_view(), name="api-run-register"),
]
