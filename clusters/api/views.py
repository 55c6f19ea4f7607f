"""The console's own REST API: projects, clusters, operations, nodes, jobs, events, scans and repairs.

Views are short: access (clusters.access) finds what the user may see, a service does the work, and a
ConsoleError it raises becomes its HTTP answer in one place (console.safejson.api_exception_handler).
"""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from console.pagination import JobCursorPagination

from .. import access, services
from ..health import scans, schedule
from ..models import Operation
from .serializers import (
    ClusterCreateSerializer,
    ClusterSerializer,
    ClusterUpdateSerializer,
    EventSerializer,
    HealthResultSerializer,
    HealthScheduleSerializer,
    JobSerializer,
    MembershipSerializer,
    NodeDetailSerializer,
    NodeSerializer,
    OperationSerializer,
    ProjectSerializer,
    RepairSerializer,
    ScanRequestSerializer,
    ScanSerializer,
)


def accepted(operation):
    return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


def json_object(request):
    if not isinstance(request.data, dict):
        raise ValidationError({"non_field_errors": ["send a JSON object"]})
    return request.data


class ProjectList(generics.ListAPIView):
    serializer_class = ProjectSerializer

    def get_queryset(self):
        return access.projects(self.request.user)


class ProjectMembers(APIView):
    """A project's members and roles. GET for every member; PUT {"username", "role"} adds a member or
    changes a role, DELETE .../members/USERNAME/ removes one (admins only; the last admin stays)."""

    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request, project):
        project = access.project(request.user, project, access.GET)
        return Response(MembershipSerializer(project.memberships.select_related("user"), many=True).data)

    @extend_schema(request=MembershipSerializer, responses=MembershipSerializer)
    def put(self, request, project):
        project = access.project(request.user, project, access.MEMBERS)
        body = json_object(request)
        membership = services.members.set_role(project, str(body.get("username", "")), body.get("role"))
        return Response(MembershipSerializer(membership).data)


class ProjectMember(APIView):
    @extend_schema(request=None, responses={204: None})
    def delete(self, request, project, username):
        project = access.project(request.user, project, access.MEMBERS)
        services.members.remove(project, username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ClusterList(generics.GenericAPIView):
    """A project's clusters by name, a page at a time (?limit, at most 1000, default 100; ?offset):
    `{count, next, previous, results}` like every list of this API, so a project with thousands of
    clusters costs one page per request."""

    serializer_class = ClusterSerializer

    @extend_schema(responses=ClusterSerializer(many=True))
    def get(self, request, project):
        clusters = access.clusters(request.user).filter(project=access.project(request.user, project))
        page = services.with_latest_operations(clusters, page=self.paginate_queryset)
        return self.get_paginated_response(ClusterSerializer(page, many=True).data)

    @extend_schema(
        request=ClusterCreateSerializer,
        responses={202: OperationSerializer},
        description="Create a cluster. With ?dry_run=true, answer 200 with the plan and cost and create nothing.",
    )
    def post(self, request, project):
        project = access.project(request.user, project, access.CREATE)
        body = ClusterCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        name, spec = body.validated_data["cluster_id"], body.validated_data["spec"]
        if request.query_params.get("dry_run") in ("1", "true", "True"):
            return Response(services.dry_run(project=project, name=name, spec=spec))
        return accepted(services.create_cluster(project=project, name=name, spec=spec, user=request.user))


class ClusterDetail(APIView):
    @extend_schema(responses=ClusterSerializer)
    def get(self, request, project, cluster):
        return Response(ClusterSerializer(access.cluster(request.user, project, cluster)).data)

    @extend_schema(request=ClusterUpdateSerializer, responses={202: OperationSerializer})
    def patch(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.UPDATE)
        body = ClusterUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return accepted(services.update_cluster(cluster=cluster, spec=body.validated_data["spec"], user=request.user))

    @extend_schema(responses={202: OperationSerializer})
    def delete(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.DELETE)
        return accepted(services.delete_cluster(cluster=cluster, user=request.user))


def freshness_headers(response, sync):
    """Say on the response how fresh the rows are: when the sync last reached Slurm, and a Warning
    when that is too long ago or Slurm is not answering (the rows are the last known state)."""
    if sync.synced:
        response["Slurm-Synced"] = sync.synced.isoformat()
    if sync.failing_since:
        response["Warning"] = '199 - "Slurm is not answering; last known states"'
    elif sync.stale:
        response["Warning"] = '199 - "Slurm state not synced recently; last known states"'
    return response


class ClusterNodes(APIView):
    @extend_schema(responses=NodeSerializer(many=True))
    def get(self, request, project, cluster):
        """Every node with Slurm's state as of the last sync (header Slurm-Synced)."""
        cluster = access.cluster(request.user, project, cluster)
        response = Response(NodeSerializer(cluster.nodes.select_related("node_pool"), many=True).data)
        return freshness_headers(response, services.sync_state(cluster))


JOB_FILTERS = [
    OpenApiParameter("state", str, description="Slurm job states or groups (active, pending, running, "
                     "completed, failed, cancelled), comma-separated"),
    OpenApiParameter("user", str, description="The Slurm user name"),
    OpenApiParameter("partition", str),
    OpenApiParameter("q", str, description="A job id, or part of a job name"),
]  # fmt: skip


class ClusterJobs(generics.ListAPIView):
    """Every job seen on the cluster as of the last sync, newest first, a cursor page at a time
    (?limit=1..1000, default 100; follow `next`). Filters: state, user, partition, q."""

    serializer_class = JobSerializer
    pagination_class = JobCursorPagination

    @extend_schema(parameters=JOB_FILTERS)
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        self.cluster = access.cluster(self.request.user, self.kwargs["project"], self.kwargs["cluster"])
        return services.jobs_of(self.cluster, services.job_filters(self.request.query_params))

    def list(self, request, *args, **kwargs):
        queryset = self.get_queryset()
        sync = services.sync_state(self.cluster)
        self.paginator.freshness = {"synced": sync.synced, "slurm_error": sync.error}
        page = self.paginate_queryset(queryset)
        response = self.get_paginated_response(self.get_serializer(page, many=True).data)
        return freshness_headers(response, sync)


class ClusterEvents(generics.ListAPIView):
    serializer_class = EventSerializer

    def get_queryset(self):
        cluster = access.cluster(self.request.user, self.kwargs["project"], self.kwargs["cluster"])
        return cluster.events.select_related("operation")


class OperationDetail(generics.RetrieveAPIView):
    serializer_class = OperationSerializer

    def get_object(self):
        project = access.project(self.request.user, self.kwargs["project"])
        return get_object_or_404(
            Operation.objects.select_related("cluster"), cluster__project=project, uuid=self.kwargs["operation"]
        )


class ClusterScans(APIView):
    """Health scans: POST starts one (optionally {"checks": [...], "thresholds": {...}}); GET lists
    the newest 20 (on-demand and scheduled scans, first scans of creates, repair verifications)."""

    @extend_schema(responses=ScanSerializer(many=True))
    def get(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster)
        found = scans.scans_of(cluster).prefetch_related("health_results", "checkpoints")[:20]
        return Response(ScanSerializer(found, many=True).data)

    @extend_schema(request=ScanRequestSerializer, responses={202: OperationSerializer})
    def post(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.RUN)
        body = ScanRequestSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        operation = scans.start_scan(
            cluster=cluster,
            checks=body.validated_data.get("checks"),
            thresholds=body.validated_data.get("thresholds"),
            user=request.user,
        )
        return accepted(operation)


class CertificateRotation(APIView):
    """POST starts a rotation of the controller's TLS certificate and CA now (optionally {"reason": "..."}),
    e.g. after a suspected leak of the controller's key; the console also rotates each certificate 60 days
    before it ends. Admins only; 409 while another operation holds the cluster."""

    @extend_schema(request=None, responses={202: OperationSerializer})
    def post(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.UPDATE)
        reason = request.data.get("reason") if isinstance(request.data, dict) else None
        if reason is not None and (not isinstance(reason, str) or len(reason) > 200):
            raise ValidationError({"reason": ["a string of at most 200 characters"]})
        operation = services.certificates.start_rotation(
            cluster, reason or f"asked for by {request.user.get_username()}", user=request.user
        )
        return accepted(operation)


class ScanDetail(APIView):
    @extend_schema(responses=ScanSerializer)
    def get(self, request, project, cluster, scan):
        cluster = access.cluster(request.user, project, cluster)
        return Response(ScanSerializer(get_object_or_404(scans.scans_of(cluster), uuid=scan)).data)


class HealthScheduleDetail(APIView):
    """The cluster's periodic scan. PUT or PATCH any of enabled, every_minutes (5-43200), checks
    ([] = every check) and idle_only; the next run moves to now + every_minutes."""

    @extend_schema(responses=HealthScheduleSerializer)
    def get(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster)
        return Response(HealthScheduleSerializer(schedule.schedule_for(cluster)).data)

    @extend_schema(request=HealthScheduleSerializer, responses=HealthScheduleSerializer)
    def patch(self, request, project, cluster):
        cluster = access.cluster(request.user, project, cluster, access.UPDATE)
        found = schedule.update_schedule(cluster, dict(json_object(request)))
        return Response(HealthScheduleSerializer(found).data)

    put = patch


class NodeDetail(APIView):
    """One node: Slurm's view, the newest result of each check, its repairs and its events."""

    @extend_schema(responses=NodeDetailSerializer)
    def get(self, request, project, cluster, node):
        cluster = access.cluster(request.user, project, cluster)
        node = get_object_or_404(cluster.nodes.select_related("node_pool"), name=node)
        latest = scans.latest_per_check(cluster).get(node.name, {})
        repairs = scans.repairs_of(cluster, node.name)[:50]
        response = Response(
            {
                **NodeDetailSerializer(node).data,
                "checks": {name: HealthResultSerializer(r).data for name, r in sorted(latest.items())},
                "repairs": RepairSerializer(repairs, many=True).data,
                "events": EventSerializer(cluster.events.filter(node=node.name)[:100], many=True).data,
            }
        )
        return freshness_headers(response, services.sync_state(cluster))


class ClusterRepairs(generics.ListAPIView):
    """Remediation history, newest first; ?node=NAME for one node's."""

    serializer_class = RepairSerializer

    def get_queryset(self):
        cluster = access.cluster(self.request.user, self.kwargs["project"], self.kwargs["cluster"])
        return scans.repairs_of(cluster, self.request.query_params.get("node")).select_related("cluster")
