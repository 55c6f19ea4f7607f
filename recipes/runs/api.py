"""The runs REST API: the catalog, launching a run with a JSON body, following, cancelling and
registering it. A ConsoleError a service raises is answered by /api/v1's one error handler."""

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters import access
from clusters.api.serializers import OperationSerializer
from console.errors import ConsoleError

from .. import registry, runs
from ..catalog import recipes
from ..models import Run
from ..registry.api import ModelVersionSerializer


class RunSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="uuid")
    summary = serializers.SerializerMethodField()
    layout = serializers.SerializerMethodField()
    launch = OperationSerializer(read_only=True)

    class Meta:
        model = Run
        fields = [
            "id", "launch", "recipe_id", "profile", "partition", "nodes", "steps", "status", "slurm_job_id",
            "slurm_state", "slurm_reason", "exit_code", "error", "work_dir", "script", "summary", "layout", "created",
            "started", "finished", "watch", "alerts", "archive",
        ]  # fmt: skip

    def get_summary(self, run) -> dict:
        return runs.summary(run)

    def get_layout(self, run) -> dict:
        return runs.layout_summary(run)


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
    alias = serializers.CharField(
        required=False,
        help_text="Move this alias of the model to the version the run registers (e.g. production: an endpoint "
        "that follows it rolls to the new version)",
    )
    stall_minutes = serializers.IntegerField(
        required=False, help_text="Alert when the running run logs no metrics line for this long (default 30)"
    )
    cancel_on_nonfinite = serializers.BooleanField(
        required=False, help_text="Cancel the run when its loss is NaN or infinite (default false: alert only)"
    )


class RecipeList(APIView):
    @extend_schema(responses={200: {"type": "array", "items": {"type": "object"}}})
    def get(self, request):
        return Response(list(recipes().values()))


class RunList(APIView):
    @extend_schema(responses=RunSerializer(many=True))
    def get(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster)
        return Response(RunSerializer(cluster.runs.all()[:200], many=True).data)

    @extend_schema(request=LaunchSerializer, responses={202: RunSerializer})
    def post(self, request, project, cluster):
        """Accepted: the run (SUBMITTING) with its `launch` operation; poll the run (or the operation) until
        the run is QUEUED with its Slurm job id, or FAILED with the launch's error."""
        cluster = access.cluster(request.user, project, cluster, access.RUN)
        if not isinstance(request.data, dict):
            raise ConsoleError("The body must be a JSON object.")
        data = {k: (str(v) if v is not None else "") for k, v in request.data.items()}
        run = runs.launch_run(cluster=cluster, data=data, user=request.user)
        headers = {"Location": reverse("api-run", args=[cluster.project.slug, cluster.name, run.uuid])}
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED, headers=headers)


def run_for(request, project, cluster, run, permission=access.GET):
    """A run of a cluster the user can see (or could, before it was deleted: runs outlive it), or 404; 403
    when their role lacks `permission`."""
    return access.of_cluster(request.user, Run.objects, project, cluster, permission, uuid=run)


class RunDetail(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run)
        return Response(RunSerializer(found).data)


class RunCancel(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run, access.RUN)
        runs.cancel_run(found)
        return Response(RunSerializer(found).data)


class RunRegister(APIView):
    @extend_schema(request=None, responses={201: ModelVersionSerializer})
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run, access.RUN)
        name = request.data.get("name", "") if isinstance(request.data, dict) else ""
        version = registry.register_run(found, name, user=request.user)
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)
