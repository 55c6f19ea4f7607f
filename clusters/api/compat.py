"""The managed service's own REST paths (v1beta1), so existing JSON files and curl scripts work unchanged.

    POST   /v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters?model_development_cluster_id=ID
    GET    /v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters[?pageSize=&pageToken=]
    GET    /v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters/{id}
    PATCH  /v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters/{id}
    DELETE /v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters/{id}
    GET    /v1beta1/projects/{project}/locations/{location}/operations/{operation}
    GET    .../modelDevelopmentClusters/{id}/slurmJobs[?pageSize=&pageToken=&filter=]   (console extension)

Writes answer with a long-running operation; errors come in the google.rpc shape
`{"error": {"code", "message", "status", "details"}}`. Clients authenticate with a console API token
as `Authorization: Bearer <token>`.
"""

import base64
import binascii
import json
import math
import re
import uuid

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from console import safejson
from console.auth import BearerTokenAuthentication
from console.errors import Conflict, ConsoleError, FieldErrors

from .. import access, services
from ..choices import ClusterStatus, OperationStatus
from ..models import Operation
from ..operations import kind
from .compat_schema import document

TYPE_PREFIX = "type.googleapis.com/google.cloud.aiplatform.v1beta1."
# The HTTP status each google.rpc status answers with (google.rpc.Code's HTTP mapping).
RPC_HTTP = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "UNAUTHENTICATED": 401,
}
# The documented analogue (persistent resources) names its states like this.
STATES = {
    ClusterStatus.DRAFT: "STATE_UNSPECIFIED",
    ClusterStatus.PROVISIONING: "PROVISIONING",
    ClusterStatus.VERIFYING: "PROVISIONING",
    ClusterStatus.READY: "RUNNING",
    ClusterStatus.DEGRADED: "RUNNING",
    ClusterStatus.UPDATING: "UPDATING",
    ClusterStatus.DELETING: "STOPPING",
    ClusterStatus.DELETED: "STOPPING",
    ClusterStatus.FAILED: "ERROR",
}
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


class RpcError(Exception):
    """A google.rpc.Status error; `violations` become a BadRequest detail with field paths."""

    def __init__(self, http, status, message, violations=None, retry_after=None):
        super().__init__(message)
        self.http, self.status, self.message, self.violations = http, status, message, violations or {}
        self.retry_after = retry_after

    def response(self):
        error = {"code": self.http, "message": self.message, "status": self.status}
        if self.retry_after:
            error["details"] = [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{self.retry_after}s"}
            ]
        if self.violations:
            error["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [
                        {"field": path, "description": message}
                        for path, messages in self.violations.items()
                        for message in messages
                    ],
                }
            ]
        response = Response({"error": error}, status=self.http)
        if self.retry_after:
            response["Retry-After"] = str(self.retry_after)
        return response


def invalid(message, violations=None):
    return RpcError(400, "INVALID_ARGUMENT", message, violations)


def rpc_error(exc):
    """The google.rpc answer for a ConsoleError: its rpc status, and field violations for bad fields."""
    if isinstance(exc, FieldErrors):
        return invalid("Request contains an invalid argument.", exc.errors)
    return RpcError(
        RPC_HTTP[exc.rpc_status], exc.rpc_status, exc.message, retry_after=getattr(exc, "retry_after", None)
    )


def timestamp(value):
    return value.isoformat().replace("+00:00", "Z") if value else None


def cluster_name(cluster):
    return f"projects/{cluster.project.slug}/locations/{cluster.location}/modelDevelopmentClusters/{cluster.name}"


def cluster_resource(cluster):
    """The service's cluster JSON, with the console's block naming the backend the cluster runs on (a spec
    without one lands on the default backend: the answer says which)."""
    return {
        "name": cluster_name(cluster),
        **cluster.spec,
        "console": {**(cluster.spec.get("console") or {}), "backend": cluster.backend},
        "state": STATES[cluster.status],
        "create_time": timestamp(cluster.created),
        "update_time": timestamp(cluster.updated),
    }


def operation_resource(operation):
    cluster = operation.cluster
    body = {
        "name": f"projects/{cluster.project.slug}/locations/{cluster.location}/operations/{operation.uuid}",
        "metadata": {
            "@type": TYPE_PREFIX + kind(operation.kind).metadata_type,
            "genericMetadata": {
                "createTime": timestamp(operation.created),
                "updateTime": timestamp(operation.finished or operation.heartbeat or operation.created),
            },
            "progressMessage": progress_message(operation),
        },
    }
    if operation.is_done:
        body["done"] = True
        if operation.status == OperationStatus.FAILED:
            body["error"] = {"code": 13, "message": operation.error}  # INTERNAL: the work failed
        elif kind(operation.kind).response == "empty":
            body["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        else:
            body["response"] = {"@type": TYPE_PREFIX + "ModelDevelopmentCluster", **cluster_resource(cluster)}
    return body


def progress_message(operation):
    if operation.status == OperationStatus.PENDING:
        return "Waiting for a worker"
    if operation.is_done:
        return "Failed" if operation.status == OperationStatus.FAILED else "Done"
    return f"{operation.step} ({operation.progress}%)"


def encode_token(value, kind="o"):
    """A page token: `kind` (o: an offset, j: the last job id of the page) and a whole number."""
    return base64.urlsafe_b64encode(f"{kind}:{value}".encode()).decode()


def decode_token(token, kind="o"):
    try:
        found, _, value = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        if found != kind or not value.isdigit():
            raise ValueError
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid("pageToken is not a token this API returned") from None


def page_size(request):
    """AIP-158 pageSize: 0 or absent is the default, above the maximum is the maximum, below 0 is a 400."""
    raw = request.query_params.get("pageSize") or request.query_params.get("page_size") or DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise invalid("pageSize must be an integer", {"pageSize": ["must be an integer"]}) from None
    if size < 0:
        raise invalid("pageSize must be 0 or more", {"pageSize": ["must be 0 (the default size) or more"]})
    return min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


class CompatView(APIView):
    """Shared auth, project lookup and google.rpc error rendering."""

    authentication_classes = [BearerTokenAuthentication]

    def handle_exception(self, exc):
        if isinstance(exc, ConsoleError):
            exc = rpc_error(exc)
        if isinstance(exc, RpcError):
            return exc.response()
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            return RpcError(401, "UNAUTHENTICATED", "Request is missing a valid bearer token.").response()
        if isinstance(exc, RequestDataTooBig):
            return invalid("Request payload size exceeds the limit.").response()
        if isinstance(exc, exceptions.ParseError):
            return invalid(f"Invalid JSON payload received. {exc.detail}").response()
        if isinstance(exc, exceptions.Throttled):  # Google's answer to a rate limit, with when to retry
            wait = max(1, math.ceil(exc.wait or 60))
            return RpcError(429, "RESOURCE_EXHAUSTED", "Quota exceeded: too many requests per minute.",
                            retry_after=wait).response()  # fmt: skip
        if isinstance(exc, exceptions.APIException):
            return RpcError(exc.status_code, "FAILED_PRECONDITION", str(exc.detail)).response()
        raise exc

    def project(self, slug, permission=access.GET):
        try:
            return access.project(self.request.user, slug, permission)
        except Http404:
            raise RpcError(
                403,
                "PERMISSION_DENIED",
                f"Permission denied on resource project {slug} (or it may not exist).",
            ) from None

    def clusters(self, project, location):
        """The project's clusters in `location`, drafts left out (they are the wizard's, not the service's)."""
        return (
            access.clusters(self.request.user)
            .exclude(status=ClusterStatus.DRAFT)
            .filter(project=self.project(project), location=location)
        )

    def cluster(self, project, location, cluster_id, permission=access.GET):
        """The cluster, after the caller's role is checked for `permission` (the service's
        modelDevelopmentClusters.* names)."""
        cluster = self.clusters(project, location).filter(name=cluster_id).first()
        if cluster is None:
            raise RpcError(404, "NOT_FOUND", f"ModelDevelopmentCluster {cluster_id} not found in {location}.")
        access.check(self.request.user, cluster.project, permission)
        return cluster

    def body(self):
        if not isinstance(self.request.data, dict):
            raise invalid("The request body must be a ModelDevelopmentCluster JSON object.")
        # Output-only fields a client may echo back from a GET.
        return {
            k: v
            for k, v in self.request.data.items()
            if k not in {"name", "state", "create_time", "update_time", "createTime", "updateTime"}
        }

    def run(self, call):
        return Response(operation_resource(call()))


@extend_schema(exclude=True)
class CompatClusters(CompatView):
    def get(self, request, project, location):
        clusters = self.clusters(project, location)
        size = page_size(request)
        token = request.query_params.get("pageToken") or request.query_params.get("page_token")
        offset = decode_token(token) if token else 0
        page = list(clusters.select_related("project").order_by("name")[offset : offset + size + 1])
        body = {"clusters": [cluster_resource(c) for c in page[:size]]}
        if len(page) > size:
            body["nextPageToken"] = encode_token(offset + size)
        return Response(body)

    def post(self, request, project, location):
        cluster_id = request.query_params.get("model_development_cluster_id") or request.query_params.get(
            "modelDevelopmentClusterId"
        )
        if not cluster_id:
            raise invalid("model_development_cluster_id is required", {"model_development_cluster_id": ["is required"]})
        project = self.project(project, access.CREATE)
        spec = self.body()
        return self.run(
            lambda: services.create_cluster(
                project=project, name=cluster_id, spec=spec, user=request.user, location=location
            )
        )


@extend_schema(exclude=True)
class CompatCluster(CompatView):
    def get(self, request, project, location, cluster):
        return Response(cluster_resource(self.cluster(project, location, cluster)))

    def patch(self, request, project, location, cluster):
        cluster = self.cluster(project, location, cluster, access.UPDATE)
        return self.run(lambda: services.update_cluster(cluster=cluster, spec=self.body(), user=request.user))

    def delete(self, request, project, location, cluster):
        cluster = self.cluster(project, location, cluster, access.DELETE)
        return self.run(lambda: services.delete_cluster(cluster=cluster, user=request.user))


SLURM_METHODS = {"HTTP_METHOD_GET": "GET", "HTTP_METHOD_POST": "POST", "HTTP_METHOD_DELETE": "DELETE"}
SLURM_PATHS = ("/slurm/", "/slurmdb/", "/openapi")
# What a slurmrestd path is made of: no percent-encoding (so no encoded '..' or '/'), no control or
# other characters, and a query of plain key=value pairs.
SLURM_PATH = re.compile(r"/(slurm|slurmdb)/[A-Za-z0-9_./-]*(\?[A-Za-z0-9_.,=&-]*)?|/openapi[A-Za-z0-9_./-]*")


def slurm_path_ok(path):
    if not isinstance(path, str) or not SLURM_PATH.fullmatch(path):
        return False
    segments = path.split("?", 1)[0].split("/")
    return not any(segment in (".", "..") for segment in segments) and "//" not in path


@extend_schema(exclude=True)
class CompatSlurmRestApi(CompatView):
    """`:callSlurmRestApi`: one request forwarded to the cluster's slurmrestd after the console's checks."""

    def post(self, request, project, location, cluster):

        cluster = self.cluster(project, location, cluster, access.RUN)
        body = request.data if isinstance(request.data, dict) else {}
        method = body.get("method")
        method = SLURM_METHODS.get(method) if isinstance(method, str) else None
        path = body.get("path", "")
        violations = {}
        if method is None:
            violations["method"] = [f"must be one of {', '.join(SLURM_METHODS)}"]
        if not slurm_path_ok(path):
            violations["path"] = [
                "must be a slurmrestd path under /slurm/, /slurmdb/ or /openapi: letters, digits, '/', '_', "
                "'-' and '.' (no '..', no percent-encoding, no control characters), optionally a ?query"
            ]
        payload = body.get("body")
        if isinstance(payload, str) and payload:
            try:
                payload = safejson.loads(payload)
            except (ValueError, UnicodeError) as exc:
                violations["body"] = [f"must be JSON: {exc}"]
        if violations:
            raise invalid("Request contains an invalid argument.", violations)
        if cluster.status not in ClusterStatus.usable():
            raise Conflict(f"Cluster {cluster.name} is not running")
        status, raw = services.call_slurm_rest(cluster, method, path, payload or None, user=request.user)
        try:
            answer = json.loads(raw or b"null")
        except ValueError:
            answer = raw.decode(errors="replace")
        return Response({"status_code": status, "body": answer})


def job_resource(cluster, job):
    return {
        "name": f"{cluster_name(cluster)}/slurmJobs/{job.job_id}",
        "jobId": job.job_id,
        "jobName": job.name,
        "user": job.user,
        "state": job.state,
        "partition": job.partition,
        "nodes": job.nodes,
        "nodeCount": job.node_count,
        "reason": job.reason,
        "exitCode": job.exit_code,
        "submitTime": timestamp(job.submit_time),
        "startTime": timestamp(job.start_time),
        "endTime": timestamp(job.end_time),
    }


FILTER_TERM = re.compile(r'\s*(state|user|partition|q)\s*=\s*("[^"]*"|[^\s"]+)\s*\Z')


def parse_filter(text):
    """An AIP-160 subset: `key=value` terms joined by AND (keys: state, user, partition, q; a value
    may be quoted); the same filters as the console's jobs list, FieldErrors under "filter"."""
    params = {}
    for term in filter(str.strip, re.split(r"\s+AND\s+", text or "")):
        match = FILTER_TERM.match(term)
        if match is None:
            raise FieldErrors({"filter": [f"'{term[:60]}' is not key=value with a key of state, user, partition, q"]})
        params[match[1]] = match[2].strip('"')
    try:
        return services.job_filters(params)
    except FieldErrors as exc:
        raise FieldErrors({f"filter.{key}": reasons for key, reasons in exc.errors.items()}) from None


@extend_schema(exclude=True)
class CompatSlurmJobs(CompatView):
    """The cluster's Slurm jobs as of the last sync (a console extension of the service's paths):
    newest first, AIP-158 pages (pageSize up to 1000, nextPageToken keyed on the job id, so pages stay
    put while jobs arrive) and an AIP-160 subset in `filter`. `syncTime` says how fresh it is."""

    def get(self, request, project, location, cluster):
        cluster = self.cluster(project, location, cluster)
        size = page_size(request)
        jobs = services.jobs_of(cluster, parse_filter(request.query_params.get("filter", "")))
        token = request.query_params.get("pageToken") or request.query_params.get("page_token")
        if token:
            jobs = jobs.filter(job_id__lt=decode_token(token, kind="j"))
        page = list(jobs.order_by("-job_id")[: size + 1])
        sync = services.sync_state(cluster)
        body = {"slurmJobs": [job_resource(cluster, job) for job in page[:size]], "syncTime": timestamp(sync.synced)}
        if sync.error:
            body["syncError"] = sync.error
        if len(page) > size:
            body["nextPageToken"] = encode_token(page[size - 1].job_id, kind="j")
        return Response(body)


@extend_schema(exclude=True)
class CompatOpenApi(CompatView):
    """The OpenAPI document of these paths (clusters/api/compat_schema.py)."""

    def get(self, request):

        return Response(document())


@extend_schema(exclude=True)
class CompatOperation(CompatView):
    def get(self, request, project, location, operation):
        try:
            operation = uuid.UUID(operation)
        except ValueError:
            raise RpcError(404, "NOT_FOUND", f"Operation {operation} not found.") from None
        found = (
            Operation.objects.select_related("cluster__project")
            .filter(cluster__project=self.project(project), cluster__location=location, uuid=operation)
            .first()
        )
        if found is None:
            raise RpcError(404, "NOT_FOUND", f"Operation {operation} not found.")
        return Response(operation_resource(found))
