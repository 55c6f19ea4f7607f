"""Runs that warn early: a loss that is no longer a number, a run that stopped logging, a run that
slowed down. Each alert is raised once per run (an event on the cluster's timeline and a banner on the
run's page, kept in `Run.alerts`); a non-finite loss also cancels the run when its launch asked for it
(`cancel_on_nonfinite`). The Slurm sync calls watch() after it stored the run's new metrics lines.
"""

import contextlib
import itertools
import math
import statistics
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from clusters.choices import EventLevel
from clusters.events import record_event
from console.errors import ConsoleError

from ..models import Run, RunStatus

NONFINITE, STALLED, SLOW = "nonfinite", "stalled", "slow"
TITLES = {NONFINITE: "The loss is not a number", STALLED: "No progress", SLOW: "Slower than before"}
SLOW_FRACTION = 0.5  # steps/s between two lines under half the run's median
SLOW_MIN_ROWS = 5  # a median needs a few steps first


def finite(values):
    """The metrics line with every non-finite number as None, and the names of those numbers: JSON
    has no NaN (PostgreSQL's jsonb refuses it), and a chart draws a gap there."""
    bad = sorted(k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v))
    if not bad:
        return values, []
    return {**values, **dict.fromkeys(bad), "nonfinite": bad}, bad


def step_rates(points):
    """Steps per second between consecutive metrics lines ((step, time) pairs): the run's speed now, where
    the lines' own tokens_per_s is an average since the start and hides a slowdown."""
    points = [(step, time) for step, time in points if isinstance(time, int | float)]
    return [
        (step - before) / (time - then)
        for (before, then), (step, time) in itertools.pairwise(points)
        if time > then and step > before
    ]


def raise_alert(run, kind, message, level=EventLevel.WARNING):
    """Record the alert once (compare-and-set on the run's alerts): returns whether this call did."""
    alerts = {**run.alerts, kind: {"at": timezone.now().isoformat(), "message": message}}
    moved = Run.objects.filter(pk=run.pk).exclude(alerts__has_key=kind).update(alerts=alerts)
    if moved:
        run.alerts = alerts
        record_event(run.cluster, f"Run {run.recipe_id} (job {run.slurm_job_id}): {message}", level=level)
    return bool(moved)


def watch(run, rows, now=None):
    """Judge the run after a sync stored `rows` (its new RunMetrics); returns the alerts raised."""
    from .follow import cancel_run

    if run.status != RunStatus.RUNNING:
        return []
    now = now or timezone.now()
    raised = []
    broken = next((r for r in rows if r.values.get("nonfinite")), None)
    if broken and NONFINITE not in run.alerts:
        names = ", ".join(broken.values["nonfinite"])
        message = f"{names} is not a finite number at step {broken.step}"
        cancel = run.watch.get("cancel_on_nonfinite", False)
        if raise_alert(run, NONFINITE, message + ("; cancelling the run" if cancel else ""), EventLevel.ERROR):
            raised.append(NONFINITE)
            if cancel:
                with contextlib.suppress(ConsoleError):  # Slurm not answering: the next sync sees the job
                    cancel_run(run)
    minutes = run.watch.get("stall_minutes", settings.RUN_STALL_MINUTES)
    since = run.metrics_seen or run.started
    if since and now - since > timedelta(minutes=minutes) and STALLED not in run.alerts:
        what = "no metrics line" if run.metrics_seen else "no first metrics line"
        if raise_alert(run, STALLED, f"{what} for {int((now - since).total_seconds() // 60)} minutes"):
            raised.append(STALLED)
    if rows and SLOW not in run.alerts:
        rates = step_rates(run.metric_rows.values_list("step", "values__time"))
        if len(rates) >= SLOW_MIN_ROWS:
            median, latest = statistics.median(rates), rates[-1]
            if latest < SLOW_FRACTION * median:
                message = (
                    f"{latest:.3g} steps/s between its last two metrics lines, {latest / median:.0%} of its median"
                )
                if raise_alert(run, SLOW, message):
                    raised.append(SLOW)
    return raised
