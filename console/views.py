"""The dashboard shell and API-token pages."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters.views import status_counts

from . import access
from .models import APIToken


def dashboard(request):
    projects = access.projects(request.user).prefetch_related("clusters")
    clusters = list(access.clusters(request.user))
    context = {"projects": projects, "clusters": clusters, "counts": status_counts(clusters)}
    return render(request, "console/dashboard.html", context)


def tokens(request):
    new_secret = None
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        if not name:
            messages.error(request, "Give the token a name, e.g. 'laptop' or 'ci'.")
        else:
            _token, new_secret = APIToken.issue(request.user, name[:100])
    context = {"tokens": request.user.api_tokens.all(), "new_secret": new_secret}
    return render(request, "console/tokens.html", context)


@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(APIToken, pk=pk, user=request.user)
    token.delete()
    messages.success(request, f"Revoked token {token.name}.")
    return redirect("tokens")
