"""URLs of the model registry pages (mounted at /models/)."""

from django.urls import path

from . import views

MODEL = "<slug:project>/<slug:name>/"

urlpatterns = [
    path("", views.model_list, name="model-list"),
    path(MODEL, views.model_detail, name="model-detail"),
    path(MODEL + "compare/", views.compare, name="model-compare"),
    path(MODEL + "aliases/", views.alias_change, name="model-alias"),
    path(MODEL + "v<int:version>/", views.version_detail, name="model-version"),
    path(MODEL + "v<int:version>/delete/", views.version_delete, name="model-version-delete"),
]
