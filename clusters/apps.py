"""App config for clusters: models, specs, backends, services, tasks, API and pages."""

from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
