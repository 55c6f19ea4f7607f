"""REST API for recipes and runs: list the catalog, launch a run with a JSON body, follow and cancel it."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.api.views import cluster_for, console_error_response
from clusters.services import ConsoleError

from . import services
from .catalog import recipes
from .models import ModelVersion, Run


class RunSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid")
    summary = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "recipe_id", "profile", "partition", "nodes", "steps", "status", "slurm_job_id", "slurm_state",
            "slurm_reason", "exit_code", "error", "work_dir", "script", "summary", "created", "started", "finished",
        ]  # fmt: skip

    def get_summary(self, run) -> dict:
        return services.summary(run)


class LaunchSerializer(serializers.Serializer):
    recipe = serializers.CharField()
    profile = serializers.CharField(required=False, default="tiny")
    partition = serializers.CharField(required=False, allow_blank=True, default="")
    nodes = serializers.IntegerField(required=False)
    steps = serializers.IntegerField(required=False)
    init_from = serializers.CharField(
        required=False, allow_null=True, help_text="A run id, or a registered model version as name:vN"
    )


class RecipeList(APIView):
    def get(self, request):
        return Response(list(recipes().values()))


class RunList(APIView):
    @extend_schema(responses=RunSerializer(many=True))
    def get(self, request, project, cluster):
        cluster = cluster_for(request, project, cluster)
        return Response(RunSerializer(cluster.runs.all()[:200], many=True).data)

    @extend_schema(request=LaunchSerializer, responses={201: RunSerializer})
    def post(self, request, project, cluster):
        cluster = cluster_for(request, project, cluster)
        if not isinstance(request.data, dict):
            return Response({"detail": "The body must be a JSON object."}, status=400)
        data = {k: (str(v) if v is not None else "") for k, v in request.data.items()}
        try:
            run = services.launch_run(cluster=cluster, data=data, user=request.user)
        except services.LaunchError as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        except ConsoleError as exc:
            return console_error_response(exc)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


def run_for(request, project, cluster, run):
    """A run of a cluster the user can see, or 404."""
    return get_object_or_404(Run, cluster=cluster_for(request, project, cluster), uuid=run)


class RunDetail(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run)
        return Response(RunSerializer(services.refresh_run(found)).data)


class RunCancel(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run)
        try:
            services.cancel_run(found)
        except ConsoleError as exc:
            return console_error_response(exc)
        return Response(RunSerializer(found).data)


class ModelVersionSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid")

    class Meta:
        model = ModelVersion
        fields = ["name", "version", "family", "step", "final_loss", "checkpoint", "run", "created"]


class RunRegister(APIView):
    @extend_schema(request=None, responses={201: ModelVersionSerializer})
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run)
        name = request.data.get("name", "") if isinstance(request.data, dict) else ""
        try:
            version = services.register_model(run=found, name=name, user=request.user)
        except services.LaunchError as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        except ConsoleError as exc:
            return console_error_response(exc)
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionList(APIView):
    @extend_schema(responses=ModelVersionSerializer(many=True))
    def get(self, request, project):
        from clusters.api.views import project_for

        versions = ModelVersion.objects.filter(project=project_for(request, project)).select_related("run")
        return Response(ModelVersionSerializer(versions, many=True).data)
