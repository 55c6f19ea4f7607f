"""Serializers for the recipes API: runs, launch requests and model versions."""

from rest_framework import serializers

from .. import services
from ..models import ModelVersion, Run


class RunSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid")
    summary = serializers.SerializerMethodField()
    layout = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "recipe_id", "profile", "partition", "nodes", "steps", "status", "slurm_job_id", "slurm_state",
            "slurm_reason", "exit_code", "error", "work_dir", "script", "summary", "layout", "created", "started",
            "finished",
        ]  # fmt: skip

    def get_summary(self, run) -> dict:
        return services.summary(run)

    def get_layout(self, run) -> dict:
        return services.layout_summary(run)


class LaunchSerializer(serializers.Serializer):
    recipe = serializers.CharField()
    profile = serializers.CharField(required=False, default="tiny")
    partition = serializers.CharField(required=False, allow_blank=True, default="")
    nodes = serializers.IntegerField(required=False)
    steps = serializers.IntegerField(required=False)
    init_from = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="A run id, or a registered model version as name:vN (required for cpt, sft and rl recipes)",
    )
    dataset = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="A .jsonl or .parquet file in the cluster's shared home (relative path); default: the recipe's",
    )


class ModelVersionSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid")

    class Meta:
        model = ModelVersion
        fields = ["name", "version", "family", "step", "final_loss", "checkpoint", "run", "created"]
