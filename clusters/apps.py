"""App config for clusters: models, specs, backends, services, tasks, API and pages."""

from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"

    def ready(self):
        # Each kind of operation is registered by the code that owns it; importing it registers it.
        from . import lifecycle  # noqa: F401  create, update, delete
        from .health import kinds  # noqa: F401  scan, repair, and the first scan of a create or resize
