"""URLs of the run pages (mounted under /clusters/<project>/<cluster>/runs/)."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.cluster_runs, name="cluster-runs"),
    path("new/", views.run_new, name="run-new"),
    path("compare/", views.run_compare, name="run-compare"),
    path("<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("<uuid:run_id>/live/", views.run_live, name="run-live"),
    path("<uuid:run_id>/log/", views.run_log, name="run-log"),
    path("<uuid:run_id>/tensorboard-files/", views.run_tensorboard_files, name="run-tensorboard-files"),
    path("<uuid:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("<uuid:run_id>/register/", views.run_register, name="run-register"),
]
