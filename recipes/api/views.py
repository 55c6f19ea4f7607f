"""REST API for recipes and runs: list the catalog, launch a run with a JSON body, follow and cancel it,
register its checkpoint. A ConsoleError a service raises is answered by /api/v1's one error handler."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from console import access
from console.errors import ConsoleError, FieldErrors

from .. import endpoints, registry, services
from ..catalog import recipes
from ..models import Endpoint, EndpointStatus, ModelVersion, Run
from .serializers import (
    AliasSerializer,
    EndpointRequestSerializer,
    EndpointSerializer,
    LaunchSerializer,
    ModelVersionSerializer,
    RunSerializer,
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
        version = registry.register_run(found, name, user=request.user)
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionList(APIView):
    @extend_schema(responses=ModelVersionSerializer(many=True))
    def get(self, request, project):
        versions = ModelVersion.objects.filter(project=access.project(request.user, project)).select_related("parent")
        query = request.query_params.get("q", "").strip()
        if query:
            versions = versions.filter(name__icontains=query)
        return Response(ModelVersionSerializer(versions, many=True).data)


def versions_of(request, project, name, permission=access.GET):
    project = access.project(request.user, project, permission)
    return project, registry.model_versions(project, name)


class ModelDetail(APIView):
    @extend_schema(responses={200: {"type": "object"}})
    def get(self, request, project, name):
        project, versions = versions_of(request, project, name)
        return Response(
            {
                "name": name,
                "aliases": registry.aliases(project, name),
                "versions": ModelVersionSerializer(versions, many=True).data,
            }
        )


class VersionDetail(APIView):
    @extend_schema(responses=ModelVersionSerializer)
    def get(self, request, project, name, version):
        project, versions = versions_of(request, project, name)
        found = get_object_or_404(versions, version=version)
        body = ModelVersionSerializer(found).data
        body["aliases"] = sorted(a for a, n in registry.aliases(project, name).items() if n == version)
        body["metrics"] = registry.metric_history(found)
        return Response(body)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, project, name, version):
        _, versions = versions_of(request, project, name, access.RUN)
        registry.delete_version(get_object_or_404(versions, version=version))
        return Response(status=status.HTTP_204_NO_CONTENT)


class Alias(APIView):
    @extend_schema(request=AliasSerializer, responses=ModelVersionSerializer)
    def put(self, request, project, name, alias):
        project, _ = versions_of(request, project, name, access.RUN)
        body = request.data if isinstance(request.data, dict) else {}
        version = registry.set_alias(project, name, alias, body.get("version"), user=request.user)
        return Response(ModelVersionSerializer(version).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, project, name, alias):
        project, _ = versions_of(request, project, name, access.RUN)
        registry.remove_alias(project, name, alias)
        return Response(status=status.HTTP_204_NO_CONTENT)


def endpoint_of(request, project, name, permission=access.GET):
    return endpoints.live_endpoint(access.project(request.user, project, permission), name)


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
        endpoint = endpoints.create_endpoint(project, body_of(request), user=request.user)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetail(APIView):
    @extend_schema(responses=EndpointSerializer)
    def get(self, request, project, name):
        return Response(EndpointSerializer(endpoint_of(request, project, name)).data)

    @extend_schema(request=EndpointRequestSerializer, responses=EndpointSerializer)
    def patch(self, request, project, name):
        endpoint = endpoint_of(request, project, name, access.RUN)
        changed = endpoints.change_endpoint(endpoint, body_of(request), user=request.user)
        return Response(EndpointSerializer(changed).data)

    @extend_schema(request=None, responses={202: EndpointSerializer})
    def delete(self, request, project, name):
        endpoint = endpoints.delete_endpoint(endpoint_of(request, project, name, access.RUN), user=request.user)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_202_ACCEPTED)


class EndpointMetrics(APIView):
    @extend_schema(responses={200: {"type": "object"}})
    def get(self, request, project, name):
        endpoint = endpoint_of(request, project, name)
        try:
            minutes = min(max(int(request.query_params.get("minutes", 15)), 1), 24 * 60)
        except ValueError:
            raise FieldErrors({"minutes": ["must be a whole number of minutes"]}) from None
        events = [{"time": e.time.isoformat(), "message": e.message} for e in endpoint.events.all()[:100]]
        return Response({"samples": endpoints.series(endpoint, minutes), "events": events})
