"""Serializers for the console's own REST API."""

import functools

from rest_framework import serializers

from .. import services
from ..choices import Role
from ..models import (
    Cluster,
    ClusterEvent,
    HealthResult,
    HealthSchedule,
    Node,
    NodePool,
    Operation,
    Project,
    SlurmJob,
)


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["slug", "name"]


class MembershipSerializer(serializers.Serializer):
    username = serializers.CharField(source="user.username")
    role = serializers.ChoiceField(choices=Role.choices)
    created = serializers.DateTimeField(read_only=True)


class NodePoolSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="pool_id")

    class Meta:
        model = NodePool
        fields = ["id", "role", "machine_type", "accelerator_type", "accelerator_count", "node_count", "zone"]


class OperationSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid")
    cluster = serializers.CharField(source="cluster.name")
    done = serializers.BooleanField(source="is_done")

    class Meta:
        model = Operation
        fields = [
            "id",
            "cluster",
            "kind",
            "status",
            "done",
            "progress",
            "step",
            "error",
            "log",
            "attempts",
            "created",
            "started",
            "finished",
        ]


class ClusterSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="name")
    project = serializers.CharField(source="project.slug")
    node_pools = NodePoolSerializer(many=True)
    latest_operation = serializers.SerializerMethodField()
    certificate_expires = serializers.SerializerMethodField(
        help_text="When the controller's TLS certificate ends (it is rotated 60 days before); null until known."
    )

    class Meta:
        model = Cluster
        fields = [
            "id",
            "project",
            "display_name",
            "location",
            "backend",
            "status",
            "status_message",
            "node_pools",
            "spec",
            "latest_operation",
            "certificate_expires",
            "created",
            "updated",
        ]

    def get_certificate_expires(self, cluster) -> str | None:
        ends = services.certificates.expires(cluster)
        return ends.isoformat() if ends else None

    def get_latest_operation(self, cluster) -> dict | None:
        # A list reads them all at once (services.with_latest_operations); one cluster asks for its own.
        if hasattr(cluster, "known_latest_operation"):
            operation = cluster.known_latest_operation
        else:
            operation = cluster.latest_operation()
        return self.operation_serializer.to_representation(operation) if operation else None

    @functools.cached_property
    def operation_serializer(self):
        # One OperationSerializer for the whole list: building its fields took 0.7 ms, 80% of a cluster's.
        return OperationSerializer()


class ClusterCreateSerializer(serializers.Serializer):
    # Not trimmed: "demo\n" is a bad id, not "demo".
    cluster_id = serializers.CharField(
        trim_whitespace=False, help_text="The cluster's id within its project, e.g. 'llama-train'."
    )
    spec = serializers.JSONField(help_text="The managed service's cluster JSON (display_name, node_pools, ...).")


class ClusterUpdateSerializer(serializers.Serializer):
    spec = serializers.JSONField(help_text="The whole new spec; only node counts (scaling_spec) may change.")


class NodeSerializer(serializers.ModelSerializer):
    node_pool = serializers.CharField(source="node_pool.pool_id")
    role = serializers.CharField(source="node_pool.role")

    class Meta:
        model = Node
        fields = ["name", "node_pool", "role", "state", "slurm_state", "slurm_reason", "slurm_seen"]


class EventSerializer(serializers.ModelSerializer):
    operation = serializers.UUIDField(source="operation.uuid", allow_null=True, default=None)

    class Meta:
        model = ClusterEvent
        fields = ["created", "level", "node", "message", "operation"]


class JobSerializer(serializers.ModelSerializer):
    elapsed_s = serializers.IntegerField(source="elapsed", allow_null=True)

    class Meta:
        model = SlurmJob
        fields = [
            "job_id", "name", "user", "state", "partition", "nodes", "node_count", "reason", "exit_code",
            "submit_time", "start_time", "end_time", "elapsed_s",
        ]  # fmt: skip


class ScanRequestSerializer(serializers.Serializer):
    checks = serializers.ListField(child=serializers.CharField(), required=False, allow_empty=False)
    thresholds = serializers.DictField(
        required=False, help_text='Overrides for this scan only, e.g. {"speed": {"straggler_fraction": 0.8}}'
    )


class HealthResultSerializer(serializers.ModelSerializer):
    check = serializers.CharField(source="check_name")

    class Meta:
        model = HealthResult
        fields = ["node", "check", "status", "values", "threshold", "reason", "repair"]


class ScanSerializer(OperationSerializer):
    results = HealthResultSerializer(source="health_results", many=True)
    checkpoint = serializers.SerializerMethodField(help_text="What the scan recorded: nodes, skipped_nodes, jobs")

    class Meta(OperationSerializer.Meta):
        fields = [*OperationSerializer.Meta.fields, "params", "checkpoint", "results"]

    def get_checkpoint(self, operation) -> dict:
        return dict(operation.checkpoint)


class RepairSerializer(OperationSerializer):
    """A REPAIR operation: which node, which failure, which rung of its ladder, and how it went."""

    node = serializers.CharField(source="params.node")
    failure = serializers.CharField(source="params.failure")
    action = serializers.CharField(source="params.action")
    verified_by = serializers.ListField(source="params.checks", default=list, child=serializers.CharField())

    class Meta(OperationSerializer.Meta):
        fields = [*OperationSerializer.Meta.fields, "node", "failure", "action", "verified_by"]


class HealthScheduleSerializer(serializers.ModelSerializer):
    class Meta:
        model = HealthSchedule
        fields = ["enabled", "every_minutes", "checks", "idle_only", "next_run", "last_run", "last_outcome"]
        read_only_fields = fields


class NodeDetailSerializer(NodeSerializer):
    repairs_taken = serializers.JSONField(source="repairs")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "repairs_taken"]
