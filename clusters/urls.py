"""URLs of the cluster pages."""

from django.urls import path

from . import views, wizard_views

urlpatterns = [
    path("new/", views.cluster_new, name="cluster-new"),
    path("wizard/", wizard_views.wizard_start, name="wizard-start"),
    path("wizard/reference/", wizard_views.wizard_reference, name="wizard-reference"),
    path("wizard/scratch/", wizard_views.wizard_scratch, name="wizard-scratch"),
    path("wizard/upload/", wizard_views.wizard_upload, name="wizard-upload"),
    path("<slug:project>/<slug:name>/wizard/review/", wizard_views.wizard_review, name="wizard-review"),
    path("<slug:project>/<slug:name>/wizard/<slug:step>/", wizard_views.wizard_step, name="wizard-step"),
    path("<slug:project>/<slug:name>/spec.json", wizard_views.cluster_spec_json, name="cluster-spec"),
    path("<slug:project>/<slug:name>/duplicate/", wizard_views.cluster_duplicate, name="cluster-duplicate"),
    path("<slug:project>/<slug:name>/", views.cluster_detail, name="cluster-detail"),
    path("<slug:project>/<slug:name>/operation/", views.cluster_operation, name="cluster-operation"),
    path("<slug:project>/<slug:name>/nodes/", views.cluster_nodes, name="cluster-nodes"),
    path("<slug:project>/<slug:name>/jobs/", views.cluster_jobs, name="cluster-jobs"),
    path("<slug:project>/<slug:name>/events/", views.cluster_events, name="cluster-events"),
    path("<slug:project>/<slug:name>/resize/", views.cluster_resize, name="cluster-resize"),
    path("<slug:project>/<slug:name>/health/", views.cluster_health, name="cluster-health"),
    path("<slug:project>/<slug:name>/scan/", views.cluster_scan, name="cluster-scan"),
    path("<slug:project>/<slug:name>/scans/<uuid:scan>/", views.scan_detail, name="scan-detail"),
    path("<slug:project>/<slug:name>/scans/<uuid:scan>/progress/", views.scan_progress, name="scan-progress"),
    path("<slug:project>/<slug:name>/nodes/<str:node>/", views.node_detail, name="node-detail"),
    path("<slug:project>/<slug:name>/health/schedule/", views.health_schedule, name="health-schedule"),
    path("<slug:project>/<slug:name>/delete/", views.cluster_delete, name="cluster-delete"),
]
