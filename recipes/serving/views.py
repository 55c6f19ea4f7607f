"""Inference endpoint pages: the endpoints of the user's projects, a create form, and an endpoint's page
(replicas, live charts of the router's samples, timeline, how to call it, deploy/scale/delete)."""

from django.conf import settings
from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from clusters import access
from console.actions import act
from console.charts import chart
from console.errors import ConsoleError, FieldErrors
from console.htmx import render_fragment

from .. import serving
from ..models import Endpoint, EndpointStatus, ModelVersion, ReplicaState

FIELDS = ("project", "name", "cluster", "model", "version", "alias", "min_replicas", "max_replicas",
          "target_in_flight", "target_p95_ms", "gpus_per_replica")  # fmt: skip


def endpoint_list(request):
    projects = access.projects(request.user)
    found = Endpoint.objects.filter(project__in=projects).exclude(status=EndpointStatus.DELETED)
    found = found.select_related("project", "cluster", "serving")
    return render(request, "recipes/endpoint_list.html", {"endpoints": found})


def endpoint_new(request):
    projects = list(access.projects(request.user, access.RUN))
    form = {k: request.POST.get(k, "").strip() for k in FIELDS} if request.method == "POST" else {
        "min_replicas": "1", "max_replicas": "2", "target_in_flight": "2",
        **{k: request.GET[k] for k in ("project", "model", "version", "alias") if k in request.GET}}  # fmt: skip
    errors = {}
    if request.method == "POST":
        project = next((p for p in projects if p.slug == form["project"]), None)
        if project is None:
            errors = {"project": ["choose one of your projects where you may run work"]}
        else:
            try:
                endpoint = serving.create_endpoint(project, form, user=request.user)
            except FieldErrors as exc:
                errors = exc.errors
            except ConsoleError as exc:
                errors = {"model": [exc.message]}
            else:
                messages.success(request, f"Endpoint {endpoint.name} is starting its replicas.")
                return redirect(endpoint)
    context = {
        "form": form,
        "errors": errors,
        "projects": projects,
        "models": ModelVersion.objects.filter(project__in=projects).values("project__slug", "name").distinct(),
    }
    return render(request, "recipes/endpoint_new.html", context, status=400 if errors else 200)


def endpoint_for(request, project, name, permission=access.GET):
    return serving.live_endpoint(access.project(request.user, project, permission), name)


WINDOWS = {"15m": 15, "1h": 60, "24h": 24 * 60}  # the time window a page's charts show: ?window=
TRAFFIC = {  # chart id: (title, {measure: label}, unit)
    "requests_per_s": ("Requests", {"requests_per_s": "requests/s"}, "req/s"),
    "latency": ("Latency", {"p50_ms": "p50", "p95_ms": "p95"}, "ms"),
    "errors": ("Errors", {"errors": "errors (5xx, unreachable)"}, ""),
    "queued": ("Queued", {"queued": "requests queued (most at once)"}, ""),
    "replicas": ("Replicas", {"replicas": "replicas routed"}, ""),
}


def window_of(request):
    window = request.GET.get("window", "1h")
    return window if window in WINDOWS else "1h"


def charts(endpoint, window="1h"):
    """The router's samples over the window, a chart per measure; periods without a sample are gaps."""
    rows = serving.traffic(endpoint, WINDOWS[window])
    found = [chart(key, title, rows, keys, x="time", unit=unit) for key, (title, keys, unit) in TRAFFIC.items()]
    return [c for c in found if c]


def live_context(request, endpoint):
    return {
        "endpoint": endpoint,
        "can_change": access.can(request.user, endpoint.project, access.RUN),
        "staging": endpoint.staging if endpoint.staging and not endpoint.staging.is_done else None,
        "replicas": endpoint.replicas.filter(state__in=ReplicaState.running()).select_related("version"),
        "charts": charts(endpoint, window_of(request)),
        "window": window_of(request),
        "windows": WINDOWS,
        "events": endpoint.events.all()[:30],
    }


def endpoint_detail(request, project, name):
    endpoint = endpoint_for(request, project, name)
    context = {
        **live_context(request, endpoint),
        "router": f"http://{settings.ROUTER_HOST}:{settings.ROUTER_PORT}/{endpoint.project.slug}/{endpoint.name}",
        "versions": ModelVersion.objects.filter(project=endpoint.project, name=endpoint.model_name),
    }
    return render(request, "recipes/endpoint_detail.html", context)


def endpoint_live(request, project, name):
    endpoint = endpoint_for(request, project, name)
    return render_fragment(request, "recipes/partials/endpoint_live.html", live_context(request, endpoint),
                           done=endpoint.status == EndpointStatus.DELETING and not endpoint.replicas.filter(
                               state__in=ReplicaState.running()).exists())  # fmt: skip


@require_POST
def endpoint_change(request, project, name):
    endpoint = endpoint_for(request, project, name, access.RUN)
    data = {k: request.POST.get(k, "").strip() for k in FIELDS if request.POST.get(k, "").strip()}
    return act(
        request,
        lambda: serving.change_endpoint(endpoint, data, user=request.user),
        done=lambda changed: f"Deploying {changed.target}; new replicas start before the old ones drain.",
        then=endpoint,
    )


@require_POST
def endpoint_delete(request, project, name):
    endpoint = endpoint_for(request, project, name, access.RUN)
    return act(
        request,
        lambda: serving.delete_endpoint(endpoint, user=request.user),
        done=f"Deleting {endpoint.name}: its replicas stop.",
        then="endpoint-list",
        failed_then=endpoint,
    )
