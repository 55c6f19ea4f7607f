"""The inference endpoints REST API: create, change (deploy, scale), delete, and the router's samples."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters import access
from console.errors import ConsoleError, FieldErrors
from console.fields import whole_number

from .. import serving
from ..models import Endpoint, EndpointStatus, ReplicaState


class EndpointSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid", read_only=True)
    cluster = serializers.CharField(source="cluster.name")
    model = serializers.CharField(source="model_name")
    serving = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()
    failure = serializers.SerializerMethodField()
    roll = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = ["id", "name", "cluster", "model", "version", "alias", "serving", "status", "failure",
                  "roll", "min_replicas", "max_replicas", "target_in_flight", "target_p95_ms", "gpus_per_replica",
                  "desired_replicas", "replicas", "created"]  # fmt: skip

    def get_failure(self, endpoint) -> dict | None:
        """The failed roll (status FAILED): the version and why; a PATCH, even empty, tries it again."""
        if not endpoint.failed_version_id:
            return None
        return {"version": endpoint.failed_version.ref, "reason": endpoint.failure}

    def get_roll(self, endpoint) -> dict | None:
        """The roll under way: {"to", "ready", "wanted", "old", "draining", "percent"}; null when none is."""
        return endpoint.roll_progress()

    def get_serving(self, endpoint) -> str | None:
        return endpoint.serving.ref if endpoint.serving else None

    def get_replicas(self, endpoint) -> list:
        return [
            {
                "id": r.pk,
                "version": r.version_ref,
                "state": r.state,
                "slurm_job_id": r.slurm_job_id,
                "node": r.node,
                "url": r.url,
            }
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
    gpus_per_replica = serializers.IntegerField(
        required=False, help_text="GPUs of one node per replica (vLLM's tensor parallel size: 1, 2, 4 or 8); 0 on CPU"
    )


def endpoint_of(request, project, name, permission=access.GET):
    return serving.live_endpoint(access.project(request.user, project, permission), name)


def body_of(request):
    if not isinstance(request.data, dict):
        raise ConsoleError("The body must be a JSON object.")
    return dict(request.data)


class EndpointList(APIView):
    @extend_schema(responses=EndpointSerializer(many=True))
    def get(self, request, project):
        found = Endpoint.objects.filter(project=access.project(request.user, project))
        return Response(EndpointSerializer(found.exclude(status=EndpointStatus.DELETED), many=True).data)

    @extend_schema(request=EndpointRequestSerializer, responses={201: EndpointSerializer})
    def post(self, request, project):
        project = access.project(request.user, project, access.RUN)
        endpoint = serving.create_endpoint(project, body_of(request), user=request.user)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetail(APIView):
    @extend_schema(responses=EndpointSerializer)
    def get(self, request, project, name):
        return Response(EndpointSerializer(endpoint_of(request, project, name)).data)

    @extend_schema(request=EndpointRequestSerializer, responses=EndpointSerializer)
    def patch(self, request, project, name):
        endpoint = endpoint_of(request, project, name, access.RUN)
        changed = serving.change_endpoint(endpoint, body_of(request), user=request.user)
        return Response(EndpointSerializer(changed).data)

    @extend_schema(request=None, responses={202: EndpointSerializer})
    def delete(self, request, project, name):
        endpoint = serving.delete_endpoint(endpoint_of(request, project, name, access.RUN), user=request.user)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_202_ACCEPTED)


class EndpointMetrics(APIView):
    @extend_schema(responses={200: {"type": "object"}})
    def get(self, request, project, name):
        endpoint = endpoint_of(request, project, name)
        errors = {}
        minutes = whole_number(request.query_params.get("minutes", 15), "minutes", errors)
        if errors:
            raise FieldErrors(errors)
        minutes = min(max(minutes, 1), 24 * 60)
        events = [{"time": e.time.isoformat(), "message": e.message} for e in endpoint.events.all()[:100]]
        return Response({"samples": serving.series(endpoint, minutes), "events": events})
