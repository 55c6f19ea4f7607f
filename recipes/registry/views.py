"""Model registry pages: the models of the user's projects (searchable), a model with its versions and
aliases, a version with its metrics, params and lineage, two versions compared. Everything a page
changes goes through recipes.registry (MLflow behind it)."""

from django.db.models import Count, Max, Q
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from clusters import access
from console.actions import act
from console.charts import overlay, training_charts
from console.errors import ConsoleError
from console.fields import whole_number

from .. import registry
from ..models import ModelVersion


def model_list(request):
    query = request.GET.get("q", "").strip()
    projects = access.projects(request.user)
    versions = ModelVersion.objects.filter(project__in=projects)
    if query:
        versions = versions.filter(Q(name__icontains=query) | Q(recipe_id__icontains=query))
    models = (
        versions.values("project__slug", "name", "family")
        .annotate(versions=Count("pk"), latest=Max("version"), updated=Max("created"))
        .order_by("-updated")[:200]
    )
    return render(request, "recipes/model_list.html", {"models": models, "query": query})


def versions_of(request, project, name, permission=access.GET):
    project = access.project(request.user, project, permission)
    return project, list(registry.model_versions(project, name))


def model_detail(request, project, name):
    project, versions = versions_of(request, project, name)
    try:
        aliases = registry.aliases(project, name)
        problem = ""
    except ConsoleError as exc:
        aliases, problem = {}, exc.message
    by_version = {}
    for alias, number in sorted(aliases.items()):
        by_version.setdefault(number, []).append(alias)
    for version in versions:
        version.aliases = by_version.get(version.version, [])
    context = {
        "project": project,
        "name": name,
        "versions": versions,
        "aliases": sorted(aliases.items()),
        "registry_problem": problem,
        "can_change": access.can(request.user, project, access.RUN),
    }
    return render(request, "recipes/model_detail.html", context)


def version_detail(request, project, name, version):
    project, versions = versions_of(request, project, name)
    found = next((v for v in versions if v.version == version), None)
    if found is None:
        raise Http404("No such version")
    problem = ""
    try:
        history = registry.metric_history(found, keys=("loss", "lr", "tokens_per_s"))
        params = registry.run_params(found)
        aliases = [a for a, n in registry.aliases(project, name).items() if n == version]
    except ConsoleError as exc:
        history, params, aliases, problem = {}, {}, [], exc.message
    rows = {}
    for key, points in history.items():
        for step, value in points:
            rows.setdefault(step, {"step": step})[key] = value
    context = {
        "project": project,
        "version": found,
        "aliases": aliases,
        "params": params,
        "charts": training_charts(list(rows.values())),
        "registry_problem": problem,
        "children": found.children.all(),
        "can_change": access.can(request.user, project, access.RUN),
    }
    return render(request, "recipes/version_detail.html", context)


def compare(request, project, name):
    """Two versions' final figures, params and loss curves side by side."""
    project, versions = versions_of(request, project, name)
    numbers = {v.version: v for v in versions}
    picked = []
    for key in ("a", "b"):
        picked.append(numbers.get(whole_number(request.GET.get(key, ""), key, {})))
    sides, problem = [], ""
    for version in picked:
        if version is None:
            continue
        try:
            history, params = registry.metric_history(version), registry.run_params(version)
        except ConsoleError as exc:
            history, params, problem = {}, {}, exc.message
        rows = [{"step": s, "loss": v} for s, v in history.get("loss", [])]
        sides.append({"version": version, "params": params, "rows": rows})
    curves = {side["version"].ref: side["rows"] for side in sides if side["rows"]}
    compared = overlay("loss-chart", "Training loss", curves, "loss", log=True) if len(curves) == 2 else None
    keys = sorted({k for side in sides for k in side["params"]})
    table = [(key, [side["params"].get(key, "-") for side in sides]) for key in keys]
    context = {"project": project, "name": name, "versions": versions, "sides": sides, "params": table,
               "picked": picked, "registry_problem": problem, "chart": compared}  # fmt: skip
    status = 400 if request.GET and len(sides) < 2 else 200
    return render(request, "recipes/model_compare.html", context, status=status)


@require_POST
def alias_change(request, project, name):
    project, _ = versions_of(request, project, name, access.RUN)
    alias = request.POST.get("alias", "").strip()
    then = reverse("model-detail", args=[project.slug, name])
    if request.POST.get("action") == "remove":
        return act(request, lambda: registry.remove_alias(project, name, alias), done=f"Removed the alias {alias}.",
                   then=then)  # fmt: skip
    return act(
        request,
        lambda: registry.set_alias(project, name, alias, request.POST.get("version"), user=request.user),
        done=lambda version: f"{alias} now points at {version.ref}.",
        then=then,
    )


@require_POST
def version_delete(request, project, name, version):
    project = access.project(request.user, project, access.RUN)
    found = get_object_or_404(ModelVersion, project=project, name=name, version=version)

    def remaining(_held):
        if ModelVersion.objects.filter(project=project, name=name).exists():
            return reverse("model-detail", args=[project.slug, name])
        return reverse("model-list")

    return act(
        request,
        lambda: registry.delete_version(found),
        done=lambda held: f"Deleted {found.ref}" + (f" (it held {', '.join(held)})." if held else "."),
        then=remaining,
        failed_then=found,
    )
