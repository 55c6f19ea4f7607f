"""Runs that warn early: a loss that is no longer a number, a run that stopped logging, a run that
slowed down, a rank on a slow node (train.py's probe: every rank times the same local work, and a rank
much slower than the others in each of the last probes is named with its node). Each alert is raised
once per run (an event on the cluster's timeline and a banner on the run's page, kept in `Run.alerts`);
a non-finite loss also cancels the run when its launch asked for it (`cancel_on_nonfinite`). The Slurm
sync calls watch() after it stored the run's new metrics lines.
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

NONFINITE, STALLED, SLOW, STRAGGLER = "nonfinite", "stalled", "slow", "straggler"
TITLES = {
    NONFINITE: "The loss is not a number",
    STALLED: "No progress",
    SLOW: "Slower than before",
    STRAGGLER: "A slow node",
}
SLOW_FRACTION = 0.5  # steps/s between two lines under half the run's median
SLOW_MIN_ROWS = 5  # a median needs a few steps first
STRAGGLER_FACTOR = 1.5  # a rank's probe this many times the other ranks' median ...
STRAGGLER_PROBES = 3  # ... in each of the run's last probes


def banners(run):
    """[(kind, title, alert)] of the run's alerts, for its page."""
    return [(kind, TITLES.get(kind, "Alert"), alert) for kind, alert in run.alerts.items()]


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


def raise_alert(run, kind, message, level=EventLevel.WARNING, node=""):
    """Record the alert once (compare-and-set on the run's alerts): returns whether this call did."""
    alert = {"at": timezone.now().isoformat(), "message": message}
    alerts = {**run.alerts, kind: {**alert, "node": node} if node else alert}
    moved = Run.objects.filter(pk=run.pk).exclude(alerts__has_key=kind).update(alerts=alerts)
    if moved:
        run.alerts = alerts
        record_event(run.cluster, f"Run {run.recipe_id} (job {run.slurm_job_id}): {message}", level=level, node=node)
    return bool(moved)


def rank_times(probe):
    """[(rank, its ms, the other ranks' median ms)] of one probe as train.py writes it ({"ms": [...],
    "nodes": [...]}), or [] for anything else."""
    ms = probe.get("ms") if isinstance(probe, dict) else None
    if not ms or len(ms) < 2 or not all(isinstance(m, int | float) and m > 0 for m in ms):
        return []
    return [(rank, mine, statistics.median(ms[:rank] + ms[rank + 1 :])) for rank, mine in enumerate(ms)]


def slowest_ratio(probe):
    """The largest ratio of one rank's probe to the median of the other ranks' (1.0: all alike), or None
    for a probe that is not one train.py wrote: what the run page charts over the steps."""
    return max((mine / others for _, mine, others in rank_times(probe)), default=None)


def slow_ranks(probe):
    """[(rank, node, its ms, the other ranks' median ms)] for every rank of one probe at least
    STRAGGLER_FACTOR times the median of the others (none without a node for every rank)."""
    nodes = (probe.get("nodes") or []) if isinstance(probe, dict) else []
    times = rank_times(probe)
    if len(nodes) != len(times):
        return []
    return [(rank, str(nodes[rank]), mine, others) for rank, mine, others in times if mine >= STRAGGLER_FACTOR * others]


def straggler(run):
    """The rank slow in each of the run's last STRAGGLER_PROBES probes, as (rank, node, ms, others' ms)
    from the latest, or None. Every collective waits for that rank, so the whole run goes at its pace."""
    probes = list(
        run.metric_rows.filter(values__has_key="probe")
        .order_by("-line")
        .values_list("values", flat=True)[:STRAGGLER_PROBES]
    )
    if len(probes) < STRAGGLER_PROBES:
        return None
    slow = [{rank: found for rank, *found in slow_ranks(values["probe"])} for values in probes]
    always = set(slow[0]).intersection(*slow[1:])
    if not always:
        return None
    rank = max(always, key=lambda r: slow[0][r][1] / slow[0][r][2])
    return (rank, *slow[0][rank])


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
    probed = rows and any("probe" in r.values for r in rows)
    slowest = straggler(run) if probed else None
    if slowest and STRAGGLER not in run.alerts:
        rank, node, ms, others = slowest
        message = (
            f"rank {rank} on {node} takes {ms / others:.1f}x as long as the other ranks for the same work "
            f"({ms:.1f} ms against {others:.1f} ms in each of the last {STRAGGLER_PROBES} probes); every rank "
            f"waits for it: drain {node} or scan it"
        )
        if raise_alert(run, STRAGGLER, message, node=node):
            raised.append(STRAGGLER)
    if rows and SLOW not in run.alerts:
        rates = step_rates(run.metric_rows.values_list("step", "values__time"))
        if len(rates) >= SLOW_MIN_ROWS:
            median, latest = statistics.median(rates), rates[-1]
            if latest < SLOW_FRACTION * median:
                message = (
                    f"{latest:.3g} steps/s between its last two metrics lines, {latest / median:.0%} of its median"
                )
                if not probed:  # the probes among the rows were judged above; older ones are judged here
                    slowest = straggler(run)
                if slowest:
                    message += f"; the slowest rank is {slowest[0]} on {slowest[1]}"
                if raise_alert(run, SLOW, message, node=slowest[1] if slowest else ""):
                    raised.append(SLOW)
    return raised
