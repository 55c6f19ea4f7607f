"""Serializers for the recipes API: runs, launch requests and model versions."""

from rest_framework import serializers

from .. import services
from ..models import Endpoint, ModelVersion, ReplicaState, Run


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
        help_text=(
            "A run id, a registered model version as name:vN or name@alias, or a Hugging Face format folder "
            "in the cluster's shared home as hf:<folder> (required for cpt, sft and rl recipes)"
        ),
    )
    dataset = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="A .jsonl or .parquet file in the cluster's shared home (relative path); default: the recipe's",
    )
    register = serializers.BooleanField(
        required=False, help_text="Register the run's model when it completes (default: the recipe's, true)"
    )
    register_as = serializers.CharField(
        required=False, help_text="The model it registers as (default: the recipe's id, e.g. llama3-1-8b-sft)"
    )


class ModelVersionSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_uuid", allow_null=True)
    cluster = serializers.CharField(source="cluster_name")
    recipe = serializers.CharField(source="recipe_id")
    parent = serializers.SerializerMethodField()
    artifact = serializers.CharField(source="checkpoint")

    class Meta:
        model = ModelVersion
        fields = ["name", "version", "family", "step", "final_loss", "artifact", "size", "run", "cluster", "recipe",
                  "parent", "automatic", "created"]  # fmt: skip

    def get_parent(self, version) -> str | None:
        return version.parent.ref if version.parent else None


class AliasSerializer(serializers.Serializer):
    version = serializers.IntegerField(help_text="The version the alias points at (moved there if elsewhere)")


class EndpointSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid", read_only=True)
    cluster = serializers.CharField(source="cluster.name")
    model = serializers.CharField(source="model_name")
    serving = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = ["id", "name", "cluster", "model", "version", "alias", "serving", "status", "min_replicas",
                  "max_replicas", "target_in_flight", "target_p95_ms", "desired_replicas", "replicas",
                  "created"]  # fmt: skip

    def get_serving(self, endpoint) -> str | None:
        return endpoint.serving.ref if endpoint.serving else None

    def get_replicas(self, endpoint) -> list:
        return [
            {"id": r.pk, "version": r.version_ref, "state": r.state, "slurm_job_id": r.slurm_job_id, "url": r.url}
            for r in endpoint.replicas.filter(state__in=ReplicaState.running())
        ]


class EndpointRequestSerializer(serializers.Serializer):
    name = serializers.CharField()
    cluster = serializers.CharField()
    model = serializers.CharField()
    version = serializers.IntegerField(required=False, help_text="a version to pin (or give alias)")
    alias = serializers.CharField(required=False, help_text="an alias to follow: moving it rolls the endpoint")
    min_replicas = serializers.IntegerField(required=False, default=1)
    max_replicas = serializers.IntegerField(required=False)
    target_in_flight = serializers.FloatField(required=False, default=2.0)
    target_p95_ms = serializers.FloatField(
        required=False, allow_null=True, help_text="scale up also when the p95 latency is above this (ms)"
    )
