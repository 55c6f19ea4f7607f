"""App config for recipes."""

from django.apps import AppConfig


class RecipesConfig(AppConfig):
    name = "recipes"

    def ready(self):
        # Runs follow their Slurm jobs and store their progress in the clusters' periodic sync.
        from clusters.services import on_sync

        from . import services

        on_sync(services.sync_runs)
