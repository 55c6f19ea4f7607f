"""The dashboard shell and API-token pages."""

from datetime import timedelta

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from clusters.views import status_counts

from . import access
from .models import APIToken


def dashboard(request):
    projects = access.projects(request.user).prefetch_related("clusters")
    clusters = list(access.clusters(request.user))
    context = {"projects": projects, "clusters": clusters, "counts": status_counts(clusters)}
    return render(request, "console/dashboard.html", context)


TOKEN_DAYS = (7, 30, 90, 365)


def tokens(request):
    new_secret, errors = None, {}
    projects = access.projects(request.user)
    form = {"name": "", "project": "", "read_only": False, "expires_days": "90"}
    if request.method == "POST":
        form = {
            "name": request.POST.get("name", "").strip(),
            "project": request.POST.get("project", ""),
            "read_only": request.POST.get("read_only") == "on",
            "expires_days": request.POST.get("expires_days", ""),
        }
        project = projects.filter(slug=form["project"]).first() if form["project"] else None
        if not form["name"]:
            errors["name"] = ["give the token a name, e.g. 'laptop' or 'ci'"]
        if form["project"] and project is None:
            errors["project"] = ["choose one of your projects, or every project"]
        if form["expires_days"] not in {"", *map(str, TOKEN_DAYS)}:
            errors["expires_days"] = [f"choose {', '.join(map(str, TOKEN_DAYS))} days, or never"]
        if not errors:
            days = int(form["expires_days"]) if form["expires_days"] else None
            _token, new_secret = APIToken.issue(
                request.user,
                form["name"][:100],
                project=project,
                read_only=form["read_only"],
                expires=timezone.now() + timedelta(days=days) if days else None,
            )
    context = {
        "tokens": request.user.api_tokens.select_related("project"),
        "new_secret": new_secret,
        "projects": projects,
        "form": form,
        "errors": errors,
        "days": TOKEN_DAYS,
    }
    return render(request, "console/tokens.html", context, status=400 if errors else 200)


@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(APIToken, pk=pk, user=request.user)
    token.delete()
    messages.success(request, f"Revoked token {token.name}.")
    return redirect("tokens")
