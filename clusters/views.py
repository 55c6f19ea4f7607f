"""Cluster pages: create from a spec, the cluster page and the fragments it polls, resize and delete."""

import copy
import json
from pathlib import Path
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from console import safejson
from console.actions import act
from console.charts import chart
from console.errors import ConsoleError, FieldErrors
from console.fields import whole_number
from console.htmx import render_fragment

from . import access, services
from .choices import CLUSTER_STATUS_COLOURS, ClusterStatus
from .health import load_checks
from .health.scans import by_node, grid_rows, latest_results, repairs_of, scannable, scans_of, start_scan
from .health.schedule import schedule_for, update_schedule
from .models import HealthResult

EXAMPLE_SPEC = Path(settings.BASE_DIR) / "examples" / "cluster-local-cpu.json"


def cluster_for(request, project, name, permission=access.GET):
    """A live cluster of one of the user's projects, or 404 (outsiders cannot tell it exists); 403
    when the user's role there lacks `permission`."""
    return access.cluster(request.user, project, name, permission)


def permissions(user, project):
    """What the page may offer: {"create", "update", "delete", "run"} -> bool for the user's role."""
    verbs = {"create": access.CREATE, "update": access.UPDATE, "delete": access.DELETE, "run": access.RUN}
    return {verb: access.can(user, project, permission) for verb, permission in verbs.items()}


def cluster_new(request):
    projects = access.projects(request.user, access.CREATE)
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
            except FieldErrors as exc:
                errors = exc.errors
            except ConsoleError as exc:
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
    context = {
        "cluster": cluster,
        "backend_label": services.backend_label(cluster),
        "pools": [{"pool": pool, "shape": shape} for pool, shape in services.node_shapes(cluster)],
        "operation": cluster.latest_operation(),
        "login_env": services.login_env(cluster),
        "login_command": services.login_command(cluster),
        "certificate_ends": services.certificates.expires(cluster),
        "renew_days": services.certificates.RENEW_DAYS,
        "scannable": scannable(cluster),
        "schedule": schedule_context(cluster) if cluster.status != ClusterStatus.DELETED else None,
        "role": access.role_in(request.user, cluster.project),
        "can": permissions(request.user, cluster.project),
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


NODES_PER_PAGE = 100


def cluster_nodes(request, project, name):
    """Each node as of the last Slurm sync (the database only; no Slurm call), a page at a time, with
    a count of nodes per Slurm state; the fragment polls its own page."""
    cluster = cluster_for(request, project, name)
    nodes = services.nodes_of(cluster)
    page = Paginator(nodes.order_by("node_pool__role", "index", "name"), NODES_PER_PAGE).get_page(
        request.GET.get("page")
    )
    context = {
        "cluster": cluster,
        "nodes": page.object_list,
        "page": page,
        "states": services.node_state_counts(cluster),
        "sync": services.sync_state(cluster),
    }
    done = cluster.status == ClusterStatus.DELETED
    return render_fragment(request, "clusters/partials/nodes.html", context, done=done)


JOBS_PER_PAGE = 50


def cluster_jobs(request, project, name):
    """The cluster's jobs as of the last sync, filtered and paginated; the fragment polls its own URL
    (filters and page included), so a poll never loses the user's place."""
    cluster = cluster_for(request, project, name)
    params = {key: request.GET.get(key, "").strip() for key in ("state", "user", "partition", "q")}
    errors = {}
    try:
        filters = services.job_filters(params)
    except FieldErrors as exc:
        errors, filters = exc.errors, {}
    page = Paginator(services.jobs_of(cluster, filters), JOBS_PER_PAGE).get_page(request.GET.get("page"))
    query = {key: value for key, value in params.items() if value}
    context = {
        "cluster": cluster,
        "jobs": page.object_list,
        "page": page,
        "params": params,
        "filtered": bool(query),
        "errors": errors,
        "query": urlencode(query),
        "self_query": urlencode({**query, "page": page.number}),
        "sync": services.sync_state(cluster),
    }
    done = cluster.status == ClusterStatus.DELETED
    return render_fragment(request, "clusters/partials/jobs.html", context, done=done)


def cluster_events(request, project, name):
    cluster = cluster_for(request, project, name)
    events = cluster.events.all()[:100]
    return render_fragment(request, "clusters/partials/events.html", {"cluster": cluster, "events": events})


@require_POST
def cluster_resize(request, project, name):
    cluster = cluster_for(request, project, name, access.UPDATE)
    pool_id = request.POST.get("node_pool", "")
    spec = copy.deepcopy(cluster.spec)
    pool = next((p for p in spec["node_pools"] if p["id"] == pool_id), None)
    count = whole_number(request.POST.get("node_count", ""), "node_count", {}, low=0)
    if pool is None or count is None:
        messages.error(request, "Choose a node pool and a node count of 0 or more.")
        return redirect(cluster)
    pool["scaling_spec"] = {"min_node_count": count, "max_node_count": count}
    return act(
        request,
        lambda: services.update_cluster(cluster=cluster, spec=spec, user=request.user),
        done=f"Resizing {pool_id} to {count} nodes.",
        then=cluster,
    )


@require_POST
def cluster_delete(request, project, name):
    cluster = cluster_for(request, project, name, access.DELETE)
    if request.POST.get("confirm") != cluster.name:
        messages.error(request, f"Type the cluster id '{cluster.name}' to confirm deletion.")
        return redirect(cluster)
    return act(
        request,
        lambda: services.delete_cluster(cluster=cluster, user=request.user),
        done=f"Deleting cluster {cluster.name}.",
        then=cluster,
    )


def status_counts(clusters):
    counts = {}
    for cluster in clusters:
        counts[cluster.status] = counts.get(cluster.status, 0) + 1
    return [(ClusterStatus(s).label, CLUSTER_STATUS_COLOURS[s], n) for s, n in counts.items()]


def cluster_health(request, project, name):
    """The newest result of every check on every node, recent scans and the schedule (polled)."""
    cluster = cluster_for(request, project, name)
    scan, grid = latest_results(cluster)
    failing_only = request.GET.get("failing") == "1"
    checks, rows = grid_rows(grid, failing_only)
    context = {
        "cluster": cluster,
        "scan": scan,
        "checks": checks,
        "rows": rows,
        "failing_only": failing_only,
        "scans": scans_of(cluster)[:8],
        "current": set(grid),
    }
    return render_fragment(request, "clusters/partials/health.html", context)


@require_POST
def cluster_scan(request, project, name):
    cluster = cluster_for(request, project, name, access.RUN)
    return act(
        request,
        lambda: start_scan(cluster=cluster, checks=request.POST.getlist("checks") or None, user=request.user),
        done="Health scan started.",
        then=lambda operation: reverse("scan-detail", args=[cluster.project.slug, cluster.name, operation.uuid]),
        failed_then=cluster,
    )


def scan_for(cluster, uuid):
    return get_object_or_404(scans_of(cluster), uuid=uuid)


def scan_detail(request, project, name, scan):
    cluster = cluster_for(request, project, name)
    return render(request, "clusters/scan_detail.html", scan_context(cluster, scan_for(cluster, scan)))


def scan_progress(request, project, name, scan):
    """The scan's progress and, once it is done, its results; 286 then, so htmx stops polling."""
    cluster = cluster_for(request, project, name)
    context = scan_context(cluster, scan_for(cluster, scan))
    return render_fragment(request, "clusters/partials/scan.html", context, done=context["operation"].is_done)


def scan_context(cluster, operation):
    checks, rows = grid_rows(by_node(operation.health_results.all()))
    current = set(cluster.wanted_nodes().values_list("name", flat=True))
    return {"cluster": cluster, "operation": operation, "checks": checks, "rows": rows, "current": current}


def node_detail(request, project, name, node):
    """One node: what Slurm says of it, each check's history (charted where it is a number), its
    repairs and its events."""
    cluster = cluster_for(request, project, name)
    node = get_object_or_404(cluster.nodes.select_related("node_pool"), name=node)
    history = {}
    recent = HealthResult.objects.filter(cluster=cluster, node=node.name).select_related("operation").order_by("-id")
    for result in recent[:400]:
        history.setdefault(result.check_name, []).append(result)
    series = {"speed": ("Speed", "gflops", "GFLOP/s"), "interconnect": ("Interconnect", "busbw_gbps", "GB/s")}
    charts = []
    for check, (title, key, unit) in series.items():
        rows = [{"time": r.created.timestamp(), key: r.values[key]} for r in history.get(check, []) if key in r.values]
        found = chart(f"{check}-chart", f"{title} by scan", rows, {key: key}, x="time", unit=unit)
        if found:
            charts.append(found)
    context = {
        "cluster": cluster,
        "node": node,
        "checks": [(check, results[:10]) for check, results in sorted(history.items())],
        "charts": charts,
        "repairs": repairs_of(cluster, node.name)[:50],
        "events": cluster.events.filter(node=node.name)[:100],
        "sync": services.sync_state(cluster),
    }
    return render(request, "clusters/node_detail.html", context)


@require_POST
def health_schedule(request, project, name):
    """Edit the periodic scan (an htmx form: the fragment comes back with field errors, values kept)."""
    cluster = cluster_for(request, project, name, access.UPDATE)
    form = {
        "enabled": request.POST.get("enabled") == "on",
        "every_hours": request.POST.get("every_hours", "").strip(),
        "checks": request.POST.getlist("checks"),
        "idle_only": request.POST.get("idle_only") == "on",
    }
    errors, saved = {}, False
    try:
        minutes = round(float(form["every_hours"]) * 60)
    except ValueError:
        errors["every_hours"] = ["must be a number of hours, e.g. 24 or 0.5"]
    if not errors:
        data = {k: form[k] for k in ("enabled", "checks", "idle_only")} | {"every_minutes": minutes}
        try:
            update_schedule(cluster, data)
            saved = True
        except FieldErrors as exc:
            errors = {("every_hours" if k == "every_minutes" else k): v for k, v in exc.errors.items()}
    context = schedule_context(cluster, form) | {"errors": errors, "saved": saved}
    return render(request, "clusters/partials/schedule.html", context, status=400 if errors else 200)


def schedule_context(cluster, form=None):
    schedule = schedule_for(cluster)
    form = form or {
        "enabled": schedule.enabled,
        "every_hours": f"{schedule.every_minutes / 60:g}",
        "checks": schedule.checks,
        "idle_only": schedule.idle_only,
    }
    return {"cluster": cluster, "schedule": schedule, "form": form, "errors": {}, "all_checks": list(load_checks())}
