"""Cluster pages: create from a spec, the cluster page and the fragments it polls, resize and delete."""

import copy
import json
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console import safejson
from console.htmx import render_fragment

from . import services
from .backends import get_backend
from .choices import CLUSTER_STATUS_COLOURS, ClusterStatus, NodeRole
from .models import Cluster, Project
from .spec import SpecError

EXAMPLE_SPEC = Path(settings.BASE_DIR) / "examples" / "cluster-local-cpu.json"


def cluster_for(request, project, name):
    """A live cluster of one of the user's projects, or 404 (outsiders cannot tell it exists)."""
    return get_object_or_404(
        Cluster.objects.live().select_related("project"),
        project__in=Project.objects.for_user(request.user),
        project__slug=project,
        name=name,
    )


def cluster_new(request):
    projects = Project.objects.for_user(request.user)
    form = {
        "project": request.GET.get("project", ""),
        "cluster_id": "",
        "spec": EXAMPLE_SPEC.read_text(),
    }
    errors = {}
    if request.method == "POST":
        form = {key: request.POST.get(key, "").strip() for key in ("project", "cluster_id", "spec")}
        project = projects.filter(slug=form["project"]).first()
        try:
            spec = safejson.loads(form["spec"])
        except safejson.JSONTooLarge as exc:
            errors["spec"] = [f"refused: {exc}"]
        except json.JSONDecodeError as exc:
            errors["spec"] = [f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"]
        if project is None:
            errors["project"] = ["choose one of your projects"]
        if not errors:
            try:
                operation = services.create_cluster(
                    project=project, name=form["cluster_id"], spec=spec, user=request.user
                )
            except SpecError as exc:
                errors = exc.errors
            except services.ConsoleError as exc:
                errors["cluster_id"] = [exc.message]
            else:
                messages.success(request, f"Creating cluster {operation.cluster.name}.")
                return redirect(operation.cluster)
    status = 400 if errors else 200
    context = {"projects": projects, "form": form, "errors": errors}
    return render(request, "clusters/cluster_new.html", context, status=status)


def cluster_detail(request, project, name):
    cluster = cluster_for(request, project, name)
    if cluster.status == ClusterStatus.DRAFT:
        return redirect("wizard-review", cluster.project.slug, cluster.name)
    backend = get_backend(cluster.backend)
    pools = []
    for pool in cluster.node_pools.prefetch_related("partitions"):
        shape = backend.node_shape(cluster, pool) if pool.role == NodeRole.COMPUTE else None
        pools.append({"pool": pool, "shape": shape})
    context = {
        "cluster": cluster,
        "backend": backend,
        "pools": pools,
        "operation": cluster.latest_operation(),
        "client_env": getattr(backend, "client_env", lambda c: {})(cluster),
    }
    return render(request, "clusters/cluster_detail.html", context)


def cluster_operation(request, project, name):
    """The latest operation's progress; answers 286 once it has finished so htmx stops polling."""
    cluster = cluster_for(request, project, name)
    operation = cluster.latest_operation()
    done = operation is None or operation.is_done
    return render_fragment(
        request, "clusters/partials/operation.html", {"cluster": cluster, "operation": operation}, done=done
    )


def cluster_nodes(request, project, name):
    cluster = cluster_for(request, project, name)
    error = services.refresh_nodes(cluster)
    nodes = cluster.nodes.select_related("node_pool").prefetch_related("node_pool__partitions")
    return render_fragment(
        request, "clusters/partials/nodes.html", {"cluster": cluster, "nodes": nodes, "error": error}
    )


def cluster_jobs(request, project, name):
    cluster = cluster_for(request, project, name)
    jobs, error = services.list_jobs(cluster)
    return render_fragment(request, "clusters/partials/jobs.html", {"cluster": cluster, "jobs": jobs, "error": error})


def cluster_events(request, project, name):
    cluster = cluster_for(request, project, name)
    events = cluster.events.all()[:100]
    return render_fragment(request, "clusters/partials/events.html", {"cluster": cluster, "events": events})


@require_POST
def cluster_resize(request, project, name):
    cluster = cluster_for(request, project, name)
    pool_id = request.POST.get("node_pool", "")
    spec = copy.deepcopy(cluster.spec)
    pool = next((p for p in spec["node_pools"] if p["id"] == pool_id), None)
    try:
        count = int(request.POST.get("node_count", ""))
    except ValueError:
        count = None
    if pool is None or count is None or count < 0:
        messages.error(request, "Choose a node pool and a node count of 0 or more.")
        return redirect(cluster)
    pool["scaling_spec"] = {"min_node_count": count, "max_node_count": count}
    try:
        services.update_cluster(cluster=cluster, spec=spec, user=request.user)
    except SpecError as exc:
        messages.error(request, "; ".join(f"{path}: {', '.join(msgs)}" for path, msgs in exc.errors.items()))
    except services.ConsoleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Resizing {pool_id} to {count} nodes.")
    return redirect(cluster)


@require_POST
def cluster_delete(request, project, name):
    cluster = cluster_for(request, project, name)
    if request.POST.get("confirm") != cluster.name:
        messages.error(request, f"Type the cluster id '{cluster.name}' to confirm deletion.")
        return redirect(cluster)
    try:
        services.delete_cluster(cluster=cluster, user=request.user)
    except services.ConsoleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Deleting cluster {cluster.name}.")
    return redirect(cluster)


def status_counts(clusters):
    counts = {}
    for cluster in clusters:
        counts[cluster.status] = counts.get(cluster.status, 0) + 1
    return [(ClusterStatus(s).label, CLUSTER_STATUS_COLOURS[s], n) for s, n in counts.items()]


def cluster_health(request, project, name):
    """The last scan's node x check grid (a fragment the cluster page polls)."""
    from .health.scans import latest_results

    cluster = cluster_for(request, project, name)
    scan, grid = latest_results(cluster)
    checks = sorted({c for row in grid.values() for c in row})
    failing_only = request.GET.get("failing") == "1"
    rows = [
        (node, [row.get(c) for c in checks])
        for node, row in sorted(grid.items())
        if not failing_only or any(r.status in ("fail", "warn") for r in row.values())
    ]
    context = {"cluster": cluster, "scan": scan, "checks": checks, "rows": rows, "failing_only": failing_only}
    return render_fragment(request, "clusters/partials/health.html", context)


@require_POST
def cluster_scan(request, project, name):
    from .health.scans import ScanError, start_scan

    cluster = cluster_for(request, project, name)
    try:
        start_scan(cluster=cluster, checks=request.POST.getlist("checks") or None, user=request.user)
    except ScanError as exc:
        messages.error(request, "; ".join(m for msgs in exc.errors.values() for m in msgs))
    except services.ConsoleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Health scan started.")
    return redirect(cluster)
