"""Run pages: launch a recipe (with the sbatch script shown before submit), follow it, cancel it."""

import io
import tempfile
import urllib.parse
import zipfile

from django.contrib import messages
from django.db.models import Q
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from clusters import access
from console.actions import act
from console.charts import chart, overlay, training_charts
from console.errors import ConsoleError, FieldErrors
from console.htmx import render_fragment

from .. import registry, runs
from ..catalog import recipes
from ..models import ModelVersion, Run
from . import alerts, follow, tensorboard

FIELDS = ("recipe", "profile", "partition", "nodes", "steps", "init_from", "dataset", "alias")


def cluster_for(request, project, name, permission=access.GET):
    return access.cluster(request.user, project, name, permission)


def run_for(request, project, name, run_id, permission=access.GET):
    """A run of the user's project's cluster `name`, which may since have been deleted (runs outlive it)."""
    return access.of_cluster(request.user, Run.objects, project, name, permission, uuid=run_id)


def run_new(request, project, name):
    cluster = cluster_for(request, project, name, access.RUN)
    form = (
        {k: request.POST.get(k, "").strip() for k in FIELDS}
        if request.method == "POST"
        else {"recipe": "llama3.1-8b-pretrain", "profile": "tiny"}
    )
    errors, script, launch = {}, None, None
    if request.method == "POST":
        try:
            if request.POST.get("confirm"):
                run = runs.launch_run(cluster=cluster, data=form, user=request.user)
                messages.success(request, "Launching: the run is submitted to Slurm once its files are written.")
                return redirect(run)
            launch, script = runs.preview(cluster, form)
        except FieldErrors as exc:
            errors = exc.errors
        except ConsoleError as exc:
            errors = {"cluster": [exc.message]}
    context = {
        "cluster": cluster,
        "recipes": recipes().values(),
        "partitions": cluster.partitions.all(),
        "previous_runs": startable_runs(cluster),
        "model_versions": ModelVersion.objects.filter(project=cluster.project)[:50],
        "form": form,
        "errors": errors,
        "script": script,
        "launch": launch,
    }
    return render(request, "recipes/run_new.html", context, status=400 if errors else 200)


def startable_runs(cluster):
    """Runs a launch on the cluster may start from: its own, and any other cluster's of the project
    (deleted ones too) whose checkpoint the registry keeps."""
    found = Run.objects.filter(Q(cluster=cluster) | Q(archive__has_key="step"), cluster__project=cluster.project)
    return found.exclude(status="FAILED").select_related("cluster")[:20]


def run_detail(request, project, name, run_id):
    run = run_for(request, project, name, run_id)
    context = {
        "run": run,
        "cluster": run.cluster,
        "versions": run.model_versions.all(),
        "layout": runs.layout_summary(run),
        **run_context(run, full_log=request.GET.get("log") == "full"),
    }
    measured, ranks = context["summary"].get("tokens_per_s"), context["layout"].get("ranks")
    context["tokens_per_rank"] = round(measured / ranks) if measured and ranks else None
    return render(request, "recipes/run_detail.html", context)


def run_live(request, project, name, run_id):
    """The polled part of the run page; 286 once the run has ended so htmx stops polling."""
    run = run_for(request, project, name, run_id)
    context = {"run": run, **run_context(run, full_log=request.GET.get("log") == "full")}
    return render_fragment(request, "recipes/partials/run_live.html", context, done=run.is_done)


def run_log(request, project, name, run_id):
    """The run's whole output file, as a download (the page shows its tail)."""
    run = run_for(request, project, name, run_id)
    try:
        log = follow.log_name(run)
    except ConsoleError as exc:
        return render(request, "recipes/run_log_missing.html", {"run": run, "reason": exc.message}, status=503)
    if not log:
        missing = {"run": run, "reason": "the job has written no output yet"}
        return render(request, "recipes/run_log_missing.html", missing, status=404)
    response = StreamingHttpResponse(follow.log_chunks(run, log), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{run.recipe_id}-{str(run.uuid)[:8]}-{log}"'
    return response


def run_tensorboard_files(request, project, name, run_id):
    """The run's TensorBoard event files that the registry keeps, as a zip (they outlive the cluster)."""
    run = run_for(request, project, name, run_id)
    if not (run.archive or {}).get("tensorboard"):
        raise Http404("The registry keeps no TensorBoard files of this run yet")
    buffer = io.BytesIO()
    top = f"{run.recipe_id}-{str(run.uuid)[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="tcc-tensorboard-") as temporary:
            folder = registry.download_tensorboard(run, temporary)
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for file in sorted(p for p in folder.rglob("*") if p.is_file()):
                    archive.write(file, f"{top}/{file.relative_to(folder)}")
    except ConsoleError as exc:
        return HttpResponse(f"The registry cannot hand out the files: {exc.message}", status=503,
                            content_type="text/plain")  # fmt: skip
    response = HttpResponse(buffer.getvalue(), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{top}-tensorboard.zip"'
    return response


def run_context(run, full_log=False):
    rows = runs.metrics(run)
    probed = [{"step": r["step"], "slowest": alerts.slowest_ratio(r["probe"])} for r in rows if "probe" in r]
    straggler = chart(
        "probe-chart", "Slowest rank against the other ranks", probed, {"slowest": "probe time / others' median"},
        unit="x",
    )  # fmt: skip
    return {
        "summary": runs.summary(run),
        "alerts": alerts.banners(run),
        "charts": training_charts(rows) + ([straggler] if straggler else []),
        "log": runs.log_view(run.log_tail, full=full_log),
        "full_log": full_log,
        "log_hidden": bool(run.log_tail) and not full_log,
        "progress": round(100 * rows[-1]["step"] / run.steps) if rows else 0,
    }


COMPARED = {"loss": ("Training loss", ""), "lr": ("Learning rate", ""), "tokens_per_s": ("Throughput", "tokens/s")}
MOST_COMPARED = 6  # the colours static/console/charts.js has (COLOURS)


def run_compare(request, project, name):
    """Several runs of the cluster on one chart: ?run=<id>&run=<id>...&metric=loss|lr|tokens_per_s."""
    cluster = cluster_for(request, project, name)
    choices = list(cluster.runs.all()[:50])
    wanted = request.GET.getlist("run")
    metric = request.GET.get("metric", "loss")
    errors = {}
    if metric not in COMPARED:
        errors["metric"] = f"Pick one of: {', '.join(COMPARED)}."
    by_id = {str(run.uuid): run for run in choices}
    picked = [by_id[w] for w in dict.fromkeys(wanted) if w in by_id]
    if len(picked) < len(dict.fromkeys(wanted)):
        errors["run"] = "Pick runs of this cluster from the list (some of those asked for are not among its last 50)."
    elif wanted and len(picked) < 2:
        errors["run"] = "Pick at least two runs to compare."
    elif len(picked) > MOST_COMPARED:
        errors["run"] = f"Compare at most {MOST_COMPARED} runs at once."
    compared = None
    if picked and not errors:
        title, unit = COMPARED[metric]
        labelled = {f"{str(run.uuid)[:8]} {run.recipe_id} ({run.profile})": runs.metrics(run) for run in picked}
        compared = overlay("compare-chart", title, labelled, metric, unit=unit, log=metric == "loss")
    context = {"cluster": cluster, "choices": choices, "picked": {str(r.uuid) for r in picked}, "metric": metric,
               "metrics": COMPARED, "chart": compared, "errors": errors, "asked": bool(wanted)}  # fmt: skip
    return render(request, "recipes/run_compare.html", context, status=400 if errors else 200)


@require_POST
def run_register(request, project, name, run_id):
    run = run_for(request, project, name, run_id, access.RUN)
    return act(
        request,
        lambda: registry.register_run(run, request.POST.get("model_name", "").strip(), user=request.user),
        done=lambda version: f"Registered {version.ref}; continued pretraining, SFT and RL can start from it.",
        then=run,
    )


@require_POST
def run_cancel(request, project, name, run_id):
    run = run_for(request, project, name, run_id, access.RUN)
    return act(request, lambda: runs.cancel_run(run), done=f"Cancelled Slurm job {run.slurm_job_id}.", then=run)


def cluster_runs(request, project, name):
    cluster = cluster_for(request, project, name)
    return render_fragment(request, "recipes/partials/runs.html", {"cluster": cluster, "runs": cluster.runs.all()[:50]})


HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length", "server", "date"}


@csrf_exempt  # TensorBoard's frontend POSTs read-only data queries without Django's token; see below
def tensorboard_proxy(request, project, name, path=""):
    """The cluster's TensorBoard, through the console's login and project check; started on first use."""
    cluster = cluster_for(request, project, name)
    if request.method not in ("GET", "HEAD") and not (request.method == "POST" and "data/" in path):
        return HttpResponse("Only reads go through to TensorBoard.", status=405, content_type="text/plain")
    target = urllib.parse.quote(path, safe="/-_.~:@!$&'()*+,;=")
    if request.META.get("QUERY_STRING"):
        target += "?" + request.META["QUERY_STRING"]
    body = request.body if request.method == "POST" else None
    try:
        status, headers, data = tensorboard.request(
            cluster, request.method, target, body, request.headers.get("Content-Type", "")
        )
    except ConsoleError as exc:
        return HttpResponse(f"TensorBoard is not available: {exc.message}", status=503, content_type="text/plain")
    response = HttpResponse(data, status=status)
    for key, value in headers:
        if key.lower() not in HOP_HEADERS:
            response[key] = value
    return response
