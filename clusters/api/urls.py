"""URLs of the console's REST API (mounted at /api/v1/)."""

from django.urls import path

from . import views

CLUSTER = "projects/<slug:project>/clusters/<slug:cluster>/"

urlpatterns = [
    path("projects/", views.ProjectList.as_view(), name="api-projects"),
    path("projects/<slug:project>/members/", views.ProjectMembers.as_view(), name="api-members"),
    path("projects/<slug:project>/members/<str:username>/", views.ProjectMember.as_view(), name="api-member"),
    path("projects/<slug:project>/clusters/", views.ClusterList.as_view(), name="api-clusters"),
    path("projects/<slug:project>/clusters/<slug:cluster>/", views.ClusterDetail.as_view(), name="api-cluster"),
    path("projects/<slug:project>/clusters/<slug:cluster>/nodes/", views.ClusterNodes.as_view(), name="api-nodes"),
    path("projects/<slug:project>/clusters/<slug:cluster>/jobs/", views.ClusterJobs.as_view(), name="api-jobs"),
    path("projects/<slug:project>/clusters/<slug:cluster>/events/", views.ClusterEvents.as_view(), name="api-events"),
    path("projects/<slug:project>/clusters/<slug:cluster>/scans/", views.ClusterScans.as_view(), name="api-scans"),
    path(CLUSTER + "scans/<uuid:scan>/", views.ScanDetail.as_view(), name="api-scan"),
    path(CLUSTER + "health/schedule/", views.HealthScheduleDetail.as_view(), name="api-health-schedule"),
    path(CLUSTER + "nodes/<str:node>/", views.NodeDetail.as_view(), name="api-node"),
    path(CLUSTER + "repairs/", views.ClusterRepairs.as_view(), name="api-repairs"),
    path(CLUSTER + "certificate/rotate/", views.CertificateRotation.as_view(), name="api-certificate-rotate"),
    path("projects/<slug:project>/operations/<uuid:operation>/", views.OperationDetail.as_view(), name="api-operation"),
]
