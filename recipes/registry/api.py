"""The model registry REST API: a project's models, their versions and aliases."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters import access

from .. import registry
from ..models import ModelVersion


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
