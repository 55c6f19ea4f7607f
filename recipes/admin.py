"""Admin for training runs."""

from django.contrib import admin

from .models import ModelVersion, Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["uuid", "cluster", "recipe_id", "profile", "status", "slurm_job_id", "nodes", "created"]
    list_filter = ["status", "recipe_id"]
    readonly_fields = ["uuid", "script", "config"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "project", "family", "step", "final_loss", "created"]
