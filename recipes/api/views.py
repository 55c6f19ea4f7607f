"""REST API for recipes and runs: list the catalog, launch a run with a JSON body, follow and cancel it,
register its checkpoint. A ConsoleError a service raises is answered by /api/v1's one error handler."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from console import access
from console.errors import ConsoleError

from .. import services
from ..catalog import recipes
from ..models import ModelVersion, Run
from .serializers import LaunchSerializer, ModelVersionSerializer, RunSerializer


class RecipeList(APIView):
    @extend_schema(responses={200: {"type": "array", "items": {"type": "object"}}})
    def get(self, request):
        return Response(list(recipes().values()))


class RunList(APIView):
    @extend_schema(responses=RunSerializer(many=True))
    def get(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster)
        return Response(RunSerializer(cluster.runs.all()[:200], many=True).data)

    @extend_schema(request=LaunchSerializer, responses={201: RunSerializer})
    def post(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.RUN)
        if not isinstance(request.data, dict):
            raise ConsoleError("The body must be a JSON object.")
        data = {k: (str(v) if v is not None else "") for k, v in request.data.items()}
        run = services.launch_run(cluster=cluster, data=data, user=request.user)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


def run_for(request, project, cluster, run, permission=access.GET):
    """A run of a cluster the user can see, or 404; 403 when their role lacks `permission`."""
    return get_object_or_404(Run, cluster=access.cluster(request.user, project, cluster, permission), uuid=run)


class RunDetail(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run)
        return Response(RunSerializer(found).data)


class RunCancel(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run, access.RUN)
        services.cancel_run(found)
        return Response(RunSerializer(found).data)


class RunRegister(APIView):
    @extend_schema(request=None, responses={201: ModelVersionSerializer})
    def post(self, request, project, cluster, run):
        found = run_for(request, project, cluster, run, access.RUN)
        name = request.data.get("name", "") if isinstance(request.data, dict) else ""
        version = services.register_model(run=found, name=name, user=request.user)
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionList(APIView):
    @extend_schema(responses=ModelVersionSerializer(many=True))
    def get(self, request, project):
        versions = ModelVersion.objects.filter(project=access.project(request.user, project)).select_related("run")
        return Response(ModelVersionSerializer(versions, many=True).data)
