"""URLs of the cluster pages."""

from django.urls import path

from . import views

urlpatterns = [
    path("new/", views.cluster_new, name="cluster-new"),
    path("<slug:project>/<slug:name>/", views.cluster_detail, name="cluster-detail"),
    path("<slug:project>/<slug:name>/operation/", views.cluster_operation, name="cluster-operation"),
    path("<slug:project>/<slug:name>/nodes/", views.cluster_nodes, name="cluster-nodes"),
    path("<slug:project>/<slug:name>/jobs/", views.cluster_jobs, name="cluster-jobs"),
    path("<slug:project>/<slug:name>/events/", views.cluster_events, name="cluster-events"),
    path("<slug:project>/<slug:name>/resize/", views.cluster_resize, name="cluster-resize"),
    path("<slug:project>/<slug:name>/delete/", views.cluster_delete, name="cluster-delete"),
]
