"""App config for recipes."""

from django.apps import AppConfig


class RecipesConfig(AppConfig):
    name = "recipes"

    def ready(self):
        # The app's code, imported here rather than at the top: Django loads app configs before models.
        from clusters.services import on_sync

        from . import runs, tasks  # noqa: F401 (tasks: every Celery task registered with the worker)

        # Runs follow their Slurm jobs and store their progress in the clusters' periodic sync.
        on_sync(runs.sync_runs)
