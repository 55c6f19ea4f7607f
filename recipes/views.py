"""Run pages: launch a recipe (with the sbatch script shown before submit), follow it, cancel it."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clusters.services import ConsoleError
from clusters.views import cluster_for
from console.htmx import render_fragment

from . import services
from .catalog import recipes
from .charts import line_chart
from .models import Run

FIELDS = ("recipe", "profile", "partition", "nodes", "steps", "init_from")


def run_for(request, project, name, run_id):
    cluster = cluster_for(request, project, name)
    return get_object_or_404(Run.objects.select_related("cluster__project"), cluster=cluster, uuid=run_id)


def run_new(request, project, name):
    cluster = cluster_for(request, project, name)
    form = (
        {k: request.POST.get(k, "").strip() for k in FIELDS}
        if request.method == "POST"
        else {"recipe": "llama3.1-8b-pretrain", "profile": "tiny"}
    )
    errors, script = {}, None
    if request.method == "POST":
        try:
            if request.POST.get("confirm"):
                run = services.launch_run(cluster=cluster, data=form, user=request.user)
                messages.success(request, f"Submitted Slurm job {run.slurm_job_id}.")
                return redirect(run)
            _launch, script = services.preview(cluster, form)
        except services.LaunchError as exc:
            errors = exc.errors
        except ConsoleError as exc:
            errors = {"cluster": [exc.message]}
    context = {
        "cluster": cluster,
        "recipes": recipes().values(),
        "partitions": cluster.partitions.all(),
        "previous_runs": Run.objects.filter(cluster__project=cluster.project).exclude(status="FAILED")[:20],
        "form": form,
        "errors": errors,
        "script": script,
    }
    return render(request, "recipes/run_new.html", context, status=400 if errors else 200)


def run_detail(request, project, name, run_id):
    run = services.refresh_run(run_for(request, project, name, run_id))
    return render(request, "recipes/run_detail.html", {"run": run, "cluster": run.cluster, **run_context(run)})


def run_live(request, project, name, run_id):
    """The polled part of the run page; 286 once the run has ended so htmx stops polling."""
    run = services.refresh_run(run_for(request, project, name, run_id))
    return render_fragment(
        request, "recipes/partials/run_live.html", {"run": run, **run_context(run)}, done=run.is_done
    )


def run_context(run):
    rows = services.metrics(run)
    return {
        "summary": services.summary(run),
        "chart": line_chart(rows, "loss"),
        "log": services.log_tail(run),
        "progress": round(100 * rows[-1]["step"] / run.steps) if rows else 0,
    }


@require_POST
def run_cancel(request, project, name, run_id):
    run = run_for(request, project, name, run_id)
    try:
        services.cancel_run(run)
    except ConsoleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Cancelled Slurm job {run.slurm_job_id}.")
    return redirect(run)


def cluster_runs(request, project, name):
    cluster = cluster_for(request, project, name)
    runs = list(cluster.runs.all()[:50])
    for run in runs:
        services.refresh_run(run)
    return render_fragment(request, "recipes/partials/runs.html", {"cluster": cluster, "runs": runs})
