"""URLs of the managed service's v1beta1 paths (mounted at /v1beta1/)."""

from django.urls import path

from . import compat

PREFIX = "projects/<slug:project>/locations/<slug:location>/"

urlpatterns = [
    path("openapi.json", compat.CompatOpenApi.as_view(), name="compat-openapi"),
    path(PREFIX + "modelDevelopmentClusters", compat.CompatClusters.as_view(), name="compat-clusters"),
    path(
        PREFIX + "modelDevelopmentClusters/<slug:cluster>:callSlurmRestApi",
        compat.CompatSlurmRestApi.as_view(),
        name="compat-slurm-rest",
    ),
    path(
        PREFIX + "modelDevelopmentClusters/<slug:cluster>/slurmJobs",
        compat.CompatSlurmJobs.as_view(),
        name="compat-slurm-jobs",
    ),
    path(PREFIX + "modelDevelopmentClusters/<slug:cluster>", compat.CompatCluster.as_view(), name="compat-cluster"),
    path(PREFIX + "operations/<str:operation>", compat.CompatOperation.as_view(), name="compat-operation"),
]
