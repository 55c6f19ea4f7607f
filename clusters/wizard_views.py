"""Wizard pages: start (reference architecture, step by step, upload), the steps, review, export, duplicate."""

import json

from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from console import safejson
from console.errors import Conflict, ConsoleError, FieldErrors
from console.fields import whole_number
from console.htmx import htmx_partial

from . import access, services, wizard
from .choices import ClusterStatus
from .models import Cluster
from .spec.catalog import REGIONS, ZONES, machine_type_names
from .spec.console_block import MTUS, storage_tiers
from .spec.plan import cost, prices, quota
from .spec.reference import architectures, build_spec
from .spec.validator import BOOT_DISK_TYPES, PREEMPT_TYPES, PRIORITY_TYPES, PROVISIONING_MODELS


def draft_for(request, project, name):
    return access.draft(request.user, project, name)


def step_url(cluster, step):
    if step == "review":
        return reverse("wizard-review", args=[cluster.project.slug, cluster.name])
    return reverse("wizard-step", args=[cluster.project.slug, cluster.name, step])


def zone_choices():
    return [(region, [f"{region}-{z}" for z in ZONES[region]]) for region in REGIONS]


def validation_errors(cluster):
    """Every error in the draft, the cluster id among them (empty when it would be accepted)."""
    try:
        services.validate_request(cluster.name, cluster.spec)
    except FieldErrors as exc:
        return exc.errors
    return {}


def start_context(request, form=None, errors=None):
    return {
        "projects": access.projects(request.user, access.CREATE),
        "drafts": access.clusters(request.user, access.CREATE).filter(status=ClusterStatus.DRAFT),
        "architectures": architectures().values(),
        "zones": zone_choices(),
        "models": PROVISIONING_MODELS,
        "backends": services.backend_choices(),
        "errors": errors or {},
        "form": form or {"zone": "us-central1-a", "nodes": 2, "model": "ON_DEMAND", "arch": "cpu"},
    }


def wizard_start(request):
    return render(request, "clusters/wizard/start.html", start_context(request))


def start_error(request, form, errors):
    return render(request, "clusters/wizard/start.html", start_context(request, form, errors), status=400)


def chosen_project(request):
    return access.projects(request.user, access.CREATE).filter(slug=request.POST.get("project", "")).first()


@require_POST
def wizard_reference(request):
    form = {
        k: request.POST.get(k, "").strip()
        for k in ("project", "cluster_id", "arch", "display_name", "zone", "nodes", "model", "reservation", "backend")
    }
    errors = {}
    project = chosen_project(request)
    if project is None:
        errors["project"] = ["choose one of your projects"]
    if form["arch"] not in architectures():
        errors["arch"] = ["choose a reference architecture"]
    nodes = whole_number(form["nodes"], "nodes", {}, low=1)
    if nodes is None:
        errors["nodes"] = ["enter a node count of 1 or more"]
    if form["model"] == "RESERVATION" and not form["reservation"]:
        errors["reservation"] = ["name the reservation to use"]
    if errors:
        return start_error(request, form, errors)
    spec = build_spec(
        form["arch"],
        display_name=form["display_name"],
        zone=form["zone"],
        nodes=nodes,
        provisioning_model=form["model"],
        reservation=form["reservation"],
        backend=form["backend"] or "local",
    )
    return start_draft(request, form, project, spec, "review")


def start_draft(request, form, project, spec, first_step):
    try:
        cluster = services.create_draft(project=project, name=form["cluster_id"], spec=spec, user=request.user)
    except FieldErrors as exc:
        return start_error(request, form, exc.errors)
    except ConsoleError as exc:
        return start_error(request, form, {"cluster_id": [exc.message]})
    return redirect(step_url(cluster, first_step))


@require_POST
def wizard_scratch(request):
    form = {k: request.POST.get(k, "").strip() for k in ("project", "cluster_id")}
    project = chosen_project(request)
    if project is None:
        return start_error(request, form, {"project": ["choose one of your projects"]})
    display = "".join(c for c in form["cluster_id"] if c.isalnum())[:10] or "cluster"
    return start_draft(request, form, project, wizard.skeleton_spec(display), "basics")


@require_POST
def wizard_upload(request):
    form = {k: request.POST.get(k, "").strip() for k in ("project", "cluster_id")}
    project = chosen_project(request)
    upload = request.FILES.get("spec_file")
    errors = {}
    if project is None:
        errors["project"] = ["choose one of your projects"]
    spec = None
    if upload is None:
        errors["spec_file"] = ["choose a JSON file"]
    elif upload.size > settings.JSON_MAX_BYTES:
        errors["spec_file"] = [
            f"refused: the JSON document is larger than the limit of {settings.JSON_MAX_BYTES:,} bytes"
        ]
    else:
        try:
            spec = safejson.loads(upload.read())
        except safejson.JSONTooLarge as exc:
            errors["spec_file"] = [f"refused: {exc}"]
        except (ValueError, UnicodeDecodeError) as exc:
            errors["spec_file"] = [f"not valid JSON: {exc}"]
        if spec is not None and not isinstance(spec, dict):
            errors["spec_file"] = ["the file must hold one JSON object (a cluster spec)"]
    if errors:
        return start_error(request, form, errors)
    return start_draft(request, form, project, spec, "review")


def wizard_step(request, project, name, step):
    cluster = draft_for(request, project, name)
    if step not in wizard.READERS:
        return redirect(step_url(cluster, "review"))
    if request.method == "POST":
        spec = wizard.apply_form(step, cluster.spec, request.POST)
        new_name = request.POST.get("cluster_id", cluster.name).strip() if step == "basics" else None
        name_error = {}
        try:
            services.save_draft(cluster, spec, name=new_name)
        except FieldErrors as exc:  # a taken or bad id: keep the rest, report the id
            services.save_draft(cluster, spec)
            name_error = exc.errors
        except Conflict as exc:
            messages.error(request, exc.message)
            return redirect(cluster)
        errors = {**validation_errors(cluster), **name_error}
        routed = wizard.errors_by_step(errors, cluster.spec)[step]
        if request.POST.get("live") and htmx_partial(request):
            return render(request, "clusters/wizard/live_errors.html", live_context(step, cluster, routed))
        go = request.POST.get("go", "")
        if go in wizard.STEP_NAMES and (
            go == "review" or not has_errors(routed) or wizard.STEP_NAMES.index(go) < wizard.STEP_NAMES.index(step)
        ):
            return redirect(step_url(cluster, go))
        if not request.POST.get("action"):
            return render_step(request, cluster, step, routed, status=400 if has_errors(routed) else 200)
        return redirect(step_url(cluster, step))
    routed = wizard.errors_by_step(validation_errors(cluster), cluster.spec)[step] if request.GET.get("check") else None
    return render_step(request, cluster, step, routed)


def has_errors(routed):
    return bool(routed["fields"] or routed["other"])


def live_context(step, cluster, routed):
    keys = wizard.step_field_keys(step, cluster.spec)
    return {"fields": [(key, routed["fields"].get(key, [])) for key in keys], "other": routed["other"]}


def render_step(request, cluster, step, routed=None, status=200):
    spec = cluster.spec
    console = spec.get("console") or {}
    storage = console.get("storage") or {}
    slurm = spec.get("orchestrator_spec", {}).get("slurm_spec", {})
    login_index = wizard.login_index(spec)
    index = wizard.STEP_NAMES.index(step)
    context = {
        "cluster": cluster,
        "step": step,
        "steps": wizard.STEPS,
        "previous": wizard.STEP_NAMES[index - 1] if index else None,
        "next": wizard.STEP_NAMES[index + 1],
        "errors": (routed or {}).get("fields", {}),
        "other_errors": (routed or {}).get("other", []),
        "spec": spec,
        "zone": wizard.zone_of(spec),
        "zones": zone_choices(),
        "backends": services.backend_choices(),
        "machine_types": machine_type_names(),
        "models": PROVISIONING_MODELS,
        "disk_types": BOOT_DISK_TYPES,
        "rows": wizard.compute_rows(spec),
        "login": spec["node_pools"][login_index] if login_index is not None else {},
        "network": console.get("network") or {},
        "mtus": MTUS,
        "home": storage.get("filestore_home"),
        "home_existing": slurm.get("home_directory_storage", ""),
        "lustre": storage.get("lustre"),
        "buckets": storage.get("gcs_buckets", []),
        "filestore_tiers": storage_tiers()["filestore"],
        "lustre_tiers": storage_tiers()["lustre"],
        "slurm": slurm,
        "scheduling": slurm.get("scheduling") or {},
        "priority_types": PRIORITY_TYPES,
        "preempt_types": PREEMPT_TYPES,
    }
    return render(request, f"clusters/wizard/step_{step}.html", context, status=status)


def wizard_review(request, project, name):
    cluster = draft_for(request, project, name)
    if request.method == "POST":
        try:
            operation = services.submit_draft(cluster=cluster, user=request.user)
        except FieldErrors:
            pass  # shown below, with links to the steps that own each error
        except ConsoleError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Creating cluster {cluster.name}.")
            return redirect(operation.cluster)
    errors = validation_errors(cluster)
    context = {
        "cluster": cluster,
        "steps": wizard.STEPS,
        "step": "review",
        "errors": sorted(
            ((wizard.route(path, cluster.spec)[0], path, message) for path, msgs in errors.items() for message in msgs),
            key=lambda e: wizard.STEP_NAMES.index(e[0]),
        ),
        "spec_json": json.dumps(cluster.spec, indent=2),
        "request_json": json.dumps({"cluster_id": cluster.name, "spec": cluster.spec}, indent=2),
    }
    if not errors:
        lines, total = cost(cluster.spec)
        context.update(
            backend_label=services.backend_label(cluster),
            plan=services.plan(cluster),
            cost_lines=lines,
            cost_total=total,
            quota=quota(cluster.project, cluster.spec, exclude=cluster),
        )

        context["prices_as_of"] = prices()["as_of"]
    status = 400 if request.method == "POST" else 200
    return render(request, "clusters/wizard/review.html", context, status=status)


def cluster_spec_json(request, project, name):
    """Export a cluster's spec (drafts too) as the JSON the API takes."""
    cluster = access.cluster(request.user, project, name)
    response = HttpResponse(json.dumps(cluster.spec, indent=2) + "\n", content_type="application/json")
    if request.GET.get("download"):
        response["Content-Disposition"] = f'attachment; filename="{cluster.name}.json"'
    return response


@require_POST
def cluster_duplicate(request, project, name):
    cluster = access.cluster(request.user, project, name, access.CREATE)
    taken = set(Cluster.objects.live().filter(project=cluster.project).values_list("name", flat=True))
    new_name = next(
        n for n in (f"{cluster.name}-copy", *(f"{cluster.name}-copy{i}" for i in range(2, 1000))) if n not in taken
    )
    copy = services.create_draft(project=cluster.project, name=new_name[:63], spec=cluster.spec, user=request.user)
    messages.success(request, f"Draft {copy.name} is a copy of {cluster.name}; change what you need, then create it.")
    return redirect(step_url(copy, "basics"))
