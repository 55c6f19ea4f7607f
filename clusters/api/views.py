"""The console's own REST API: projects, clusters, operations, nodes, jobs and events."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import services
from ..models import Cluster, Operation, Project
from ..spec import SpecError
from ..views import cluster_for  # the pages' rule; DRF answers its Http404 as a JSON 404
from .serializers import (
    ClusterCreateSerializer,
    ClusterSerializer,
    ClusterUpdateSerializer,
    EventSerializer,
    HealthResultSerializer,
    HealthScheduleSerializer,
    JobSerializer,
    NodeDetailSerializer,
    NodeSerializer,
    OperationSerializer,
    ProjectSerializer,
    RepairSerializer,
    ScanRequestSerializer,
    ScanSerializer,
)


def project_for(request, slug):
    """The project, or 404 when it does not exist or the user is not a member (no difference shown)."""
    return get_object_or_404(Project.objects.for_user(request.user), slug=slug)


def spec_error_response(exc):
    errors = dict(exc.errors)
    body = {"cluster_id": errors.pop("cluster_id")} if "cluster_id" in errors else {}
    if errors:
        body["spec"] = errors
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


def console_error_response(exc):
    return Response({"detail": exc.message}, status=exc.code)


def accepted(operation):
    return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


class ProjectList(generics.ListAPIView):
    serializer_class = ProjectSerializer

    def get_queryset(self):
        return Project.objects.for_user(self.request.user)


class ClusterList(APIView):
    @extend_schema(responses=ClusterSerializer(many=True))
    def get(self, request, project):
        clusters = Cluster.objects.live().filter(project=project_for(request, project)).select_related("project")
        return Response(ClusterSerializer(clusters.prefetch_related("node_pools"), many=True).data)

    @extend_schema(
        request=ClusterCreateSerializer,
        responses={202: OperationSerializer},
        description="Create a cluster. With ?dry_run=true, answer 200 with the plan and cost and create nothing.",
    )
    def post(self, request, project):
        project = project_for(request, project)
        body = ClusterCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if request.query_params.get("dry_run") in ("1", "true", "True"):
            try:
                return Response(
                    services.dry_run(
                        project=project, name=body.validated_data["cluster_id"], spec=body.validated_data["spec"]
                    )
                )
            except SpecError as exc:
                return spec_error_response(exc)
            except services.ConsoleError as exc:
                return console_error_response(exc)
        try:
            operation = services.create_cluster(
                project=project,
                name=body.validated_data["cluster_id"],
                spec=body.validated_data["spec"],
                user=request.user,
            )
        except SpecError as exc:
            return spec_error_response(exc)
        except services.ConsoleError as exc:
            return console_error_response(exc)
        return accepted(operation)


class ClusterDetail(APIView):
    @extend_schema(responses=ClusterSerializer)
    def get(self, request, project, cluster):
        return Response(ClusterSerializer(cluster_for(request, project, cluster)).data)

    @extend_schema(request=ClusterUpdateSerializer, responses={202: OperationSerializer})
    def patch(self, request, project, cluster):
        cluster = cluster_for(request, project, cluster)
        body = ClusterUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            operation = services.update_cluster(cluster=cluster, spec=body.validated_data["spec"], user=request.user)
        except SpecError as exc:
            return spec_error_response(exc)
        except services.ConsoleError as exc:
            return console_error_response(exc)
        return accepted(operation)

    @extend_schema(responses={202: OperationSerializer})
    def delete(self, request, project, cluster):
        cluster = cluster_for(request, project, cluster)
        try:
            operation = services.delete_cluster(cluster=cluster, user=request.user)
        except services.ConsoleError as exc:
            return console_error_response(exc)
        return accepted(operation)


class ClusterNodes(APIView):
    @extend_schema(responses=NodeSerializer(many=True))
    def get(self, request, project, cluster):
        cluster = cluster_for(request, project, cluster)
        services.refresh_nodes(cluster)
        return Response(NodeSerializer(cluster.nodes.select_related("node_pool"), many=True).data)


class ClusterJobs(APIView):
    @extend_schema(responses=JobSerializer(many=True))
    def get(self, request, project, cluster):
        """Every job seen on the cluster, newest first; the last known states when Slurm is unreachable."""
        jobs, error = services.list_jobs(cluster_for(request, project, cluster))
        response = Response(JobSerializer(jobs, many=True).data)
        if error:
            response["Warning"] = '199 - "Slurm is not answering; last known states"'
        return response


class ClusterEvents(generics.ListAPIView):
    serializer_class = EventSerializer

    def get_queryset(self):
        cluster = cluster_for(self.request, self.kwargs["project"], self.kwargs["cluster"])
        return cluster.events.select_related("operation")


class OperationDetail(generics.RetrieveAPIView):
    serializer_class = OperationSerializer

    def get_object(self):
        project = project_for(self.request, self.kwargs["project"])
        return get_object_or_404(
            Operation.objects.select_related("cluster"), cluster__project=project, uuid=self.kwargs["operation"]
        )


class ClusterScans(APIView):
    """Health scans: POST starts one (optionally {"checks": [...], "thresholds": {...}}); GET lists
    the newest 20 (on-demand and scheduled scans, first scans of creates, repair verifications)."""

    @extend_schema(responses=ScanSerializer(many=True))
    def get(self, request, project, cluster):
        from ..health.scans import scans_of

        cluster = cluster_for(request, project, cluster)
        return Response(ScanSerializer(scans_of(cluster).prefetch_related("health_results")[:20], many=True).data)

    @extend_schema(request=ScanRequestSerializer, responses={202: OperationSerializer})
    def post(self, request, project, cluster):
        from ..health.scans import ScanError, start_scan

        cluster = cluster_for(request, project, cluster)
        body = ScanRequestSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        try:
            operation = start_scan(
                cluster=cluster,
                checks=body.validated_data.get("checks"),
                thresholds=body.validated_data.get("thresholds"),
                user=request.user,
            )
        except ScanError as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        except services.ConsoleError as exc:
            return console_error_response(exc)
        return accepted(operation)


class ScanDetail(APIView):
    @extend_schema(responses=ScanSerializer)
    def get(self, request, project, cluster, scan):
        from ..health.scans import scans_of

        cluster = cluster_for(request, project, cluster)
        return Response(ScanSerializer(get_object_or_404(scans_of(cluster), uuid=scan)).data)


class HealthScheduleDetail(APIView):
    """The cluster's periodic scan. PUT or PATCH any of enabled, every_minutes (5-43200), checks
    ([] = every check) and idle_only; the next run moves to now + every_minutes."""

    @extend_schema(responses=HealthScheduleSerializer)
    def get(self, request, project, cluster):
        from ..health.schedule import schedule_for

        return Response(HealthScheduleSerializer(schedule_for(cluster_for(request, project, cluster))).data)

    @extend_schema(request=HealthScheduleSerializer, responses=HealthScheduleSerializer)
    def patch(self, request, project, cluster):
        from ..health.scans import ScanError
        from ..health.schedule import update_schedule

        cluster = cluster_for(request, project, cluster)
        if not isinstance(request.data, dict):
            return Response({"non_field_errors": ["send a JSON object"]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            schedule = update_schedule(cluster, dict(request.data))
        except ScanError as exc:
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        return Response(HealthScheduleSerializer(schedule).data)

    put = patch


class NodeDetail(APIView):
    """One node: Slurm's view, the newest result of each check, its repairs and its events."""

    @extend_schema(responses=NodeDetailSerializer)
    def get(self, request, project, cluster, node):
        from ..health.scans import latest_per_check, repairs_of

        cluster = cluster_for(request, project, cluster)
        services.refresh_nodes(cluster)
        node = get_object_or_404(cluster.nodes.select_related("node_pool"), name=node)
        latest = latest_per_check(cluster).get(node.name, {})
        repairs = repairs_of(cluster, node.name)[:50]
        return Response(
            {
                **NodeDetailSerializer(node).data,
                "checks": {name: HealthResultSerializer(r).data for name, r in sorted(latest.items())},
                "repairs": RepairSerializer(repairs, many=True).data,
                "events": EventSerializer(cluster.events.filter(node=node.name)[:100], many=True).data,
            }
        )


class ClusterRepairs(generics.ListAPIView):
    """Remediation history, newest first; ?node=NAME for one node's."""

    serializer_class = RepairSerializer

    def get_queryset(self):
        from ..health.scans import repairs_of

        cluster = cluster_for(self.request, self.kwargs["project"], self.kwargs["cluster"])
        return repairs_of(cluster, self.request.query_params.get("node")).select_related("cluster")
