"""The dashboard shell and API-token pages."""

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.db.models import Count, Sum
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.defaults import page_not_found
from django.views.defaults import server_error as defaults_server_error

from clusters import access
from clusters.models import HealthResult
from clusters.views import status_counts
from recipes.models import Endpoint, EndpointSample, EndpointStatus, ModelVersion, Run, RunStatus

from .errors import surface_error
from .models import APIToken, SignInFailure


class SignInView(auth_views.LoginView):
    """Django's login page with a throttle: after LOGIN_FAILURES_PER_USER failed sign-ins for one
    username from one address (or LOGIN_FAILURES_PER_ADDRESS from one address, whatever the names)
    within LOGIN_THROTTLE_MINUTES, sign-ins from that address (for that username) are refused with a 429
    until the window has passed, the right password included. The key is the address and the name
    together: failures from elsewhere never lock a user out (else anyone could lock out an admin by
    typing their name)."""

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")[:150]
        if throttled(username, client_address(request)):
            form = self.get_form()
            minutes = settings.LOGIN_THROTTLE_MINUTES
            form.errors.clear()
            form.add_error(None, f"Too many failed sign-ins; try again in {minutes} minutes.")
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        SignInFailure.objects.create(
            username=self.request.POST.get("username", "")[:150], address=client_address(self.request)
        )
        return super().form_invalid(form)

    def form_valid(self, form):
        SignInFailure.objects.filter(
            username=form.get_user().get_username(), address=client_address(self.request)
        ).delete()
        return super().form_valid(form)


def client_address(request):
    return request.META.get("REMOTE_ADDR") or None


def throttled(username, address):
    since = timezone.now() - timedelta(minutes=settings.LOGIN_THROTTLE_MINUTES)
    recent = SignInFailure.objects.filter(created__gte=since, address=address)
    return (
        recent.filter(username=username).count() >= settings.LOGIN_FAILURES_PER_USER
        or recent.count() >= settings.LOGIN_FAILURES_PER_ADDRESS
    )


def not_found(request, exception=None):
    """404 in the shape of the surface asked: JSON on /api/, google.rpc on /v1beta1/, a page elsewhere."""
    answer = surface_error(request, 404, "Not found.", "NOT_FOUND", rpc_message=f"No such resource: {request.path}")
    return answer or page_not_found(request, exception)


def server_error(request):
    """500 without a traceback or a setting in it, in the surface's shape (it is logged, not shown)."""
    answer = surface_error(
        request, 500, "Internal error; it has been logged.", "INTERNAL", rpc_message="Internal error."
    )
    return answer or defaults_server_error(request)


def dashboard(request):
    """The projects' overview: clusters with their health, runs in progress, the newest model versions
    and the endpoints with their traffic; all from the database (what the syncs and the router wrote)."""
    projects = access.projects(request.user).prefetch_related("clusters")
    clusters = list(access.clusters(request.user))
    failing = dict(
        HealthResult.objects.filter(cluster__in=clusters, latest=True, status="fail")
        .values_list("cluster_id").annotate(nodes=Count("node", distinct=True)).order_by()
    )  # fmt: skip
    for cluster in clusters:
        cluster.failing_nodes = failing.get(cluster.pk, 0)
    context = {
        "projects": projects,
        "clusters": clusters,
        "counts": status_counts(clusters),
        "runs": runs_in_progress(projects),
        "versions": ModelVersion.objects.filter(project__in=projects).select_related("project")
        .order_by("-created")[:6],
        "endpoints": endpoints_with_traffic(projects),
    }  # fmt: skip
    return render(request, "console/dashboard.html", context)


def runs_in_progress(projects, limit=8):
    """The projects' runs not yet done, newest first, each with its last logged step and loss."""
    runs = list(
        Run.objects.filter(cluster__project__in=projects).exclude(status__in=RunStatus.done())
        .select_related("cluster__project").order_by("-created")[:limit]
    )  # fmt: skip
    for run in runs:
        last = run.metric_rows.order_by("-line").values_list("values", flat=True).first() or {}
        run.last_step, run.last_loss = last.get("step"), last.get("loss")
        run.progress = round(100 * (last.get("step") or 0) / run.steps) if run.steps else 0
    return runs


def endpoints_with_traffic(projects, minutes=5):
    """The projects' live endpoints with requests/s and 5xx errors over the router's last `minutes`."""
    since = timezone.now() - timedelta(minutes=minutes)
    endpoints = list(
        Endpoint.objects.filter(project__in=projects, status__in=EndpointStatus.live())
        .select_related("project", "serving").order_by("project__slug", "name")
    )  # fmt: skip
    traffic = {
        row["endpoint_id"]: row
        for row in EndpointSample.objects.filter(endpoint__in=endpoints, time__gte=since)
        .values("endpoint_id").annotate(requests=Sum("requests"), errors=Sum("errors"))
        .order_by()
    }  # fmt: skip
    now = timezone.now()
    for endpoint in endpoints:
        row = traffic.get(endpoint.pk) or {}
        # Over the window (or the endpoint's life if shorter): several routers' samples add up.
        window = min(minutes * 60, max(1.0, (now - endpoint.created).total_seconds()))
        endpoint.requests_per_s = (row.get("requests") or 0) / window
        endpoint.errors = row.get("errors") or 0
    return endpoints


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
