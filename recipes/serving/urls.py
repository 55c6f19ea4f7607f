"""URLs of the inference endpoint pages (mounted at /endpoints/)."""

from django.urls import path

from . import views

ENDPOINT = "<slug:project>/<slug:name>/"

urlpatterns = [
    path("", views.endpoint_list, name="endpoint-list"),
    path("new/", views.endpoint_new, name="endpoint-new"),
    path(ENDPOINT, views.endpoint_detail, name="endpoint-detail"),
    path(ENDPOINT + "live/", views.endpoint_live, name="endpoint-live"),
    path(ENDPOINT + "change/", views.endpoint_change, name="endpoint-change"),
    path(ENDPOINT + "delete/", views.endpoint_delete, name="endpoint-delete"),
]
