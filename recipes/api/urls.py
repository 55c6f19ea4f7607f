"""URLs of the recipes API (mounted at /api/v1/ beside the clusters API)."""

from django.urls import path

from . import views

CLUSTER = "projects/<slug:project>/clusters/<slug:cluster>/"

urlpatterns = [
    path("recipes/", views.RecipeList.as_view(), name="api-recipes"),
    path("projects/<slug:project>/models/", views.ModelVersionList.as_view(), name="api-models"),
    path(CLUSTER + "runs/", views.RunList.as_view(), name="api-runs"),
    path(CLUSTER + "runs/<uuid:run>/", views.RunDetail.as_view(), name="api-run"),
    path(CLUSTER + "runs/<uuid:run>/cancel/", views.RunCancel.as_view(), name="api-run-cancel"),
    path(CLUSTER + "runs/<uuid:run>/register/", views.RunRegister.as_view(), name="api-run-register"),
]
