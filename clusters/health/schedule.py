"""Periodic health scans per cluster: an editable schedule (HealthSchedule) and the beat task's work.

The `run-due-scans` beat task calls `run_due_scans()` every minute. A due schedule is claimed with a
compare-and-set on its `next_run`, so two beat processes (or a slow tick) never start the same scan
twice. A cluster busy with another operation is tried again a few minutes later; one with no idle
node (idle_only) an hour later; neither counts as a scan.
"""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from console.errors import Conflict, FieldErrors

from ..choices import ClusterStatus
from ..models import HealthSchedule
from . import unknown_checks
from .scans import start_scan, targets

MIN_MINUTES, MAX_MINUTES = 5, 30 * 24 * 60
BUSY_RETRY, NO_IDLE_RETRY = timedelta(minutes=5), timedelta(hours=1)


def schedule_for(cluster):
    """The cluster's schedule, made on first use from HEALTH_SCAN_EVERY_HOURS (0: made disabled)."""
    hours = settings.HEALTH_SCAN_EVERY_HOURS
    minutes = max(MIN_MINUTES, round(hours * 60)) if hours > 0 else 24 * 60
    schedule, _ = HealthSchedule.objects.get_or_create(
        cluster=cluster,
        defaults={
            "enabled": hours > 0,
            "every_minutes": minutes,
            "next_run": timezone.now() + timedelta(minutes=minutes),
        },
    )
    return schedule


def schedule_errors(data):
    """{field: [reason]} for a schedule change: enabled, every_minutes, checks, idle_only."""
    errors = {}
    unknown = sorted(set(data) - {"enabled", "every_minutes", "checks", "idle_only"})
    for field in unknown:
        errors[field] = ["unknown field; the schedule has enabled, every_minutes, checks and idle_only"]
    for field in ("enabled", "idle_only"):
        if field in data and not isinstance(data[field], bool):
            errors[field] = ["must be true or false"]
    if "every_minutes" in data:
        value = data["every_minutes"]
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_MINUTES <= value <= MAX_MINUTES:
            errors["every_minutes"] = [f"must be whole minutes from {MIN_MINUTES} to {MAX_MINUTES} (30 days)"]
    if "checks" in data:
        checks = data["checks"]
        if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
            errors["checks"] = ["must be a list of check names (empty: every check)"]
        elif unknown_checks(checks):
            errors["checks"] = unknown_checks(checks)
    return errors


def update_schedule(cluster, data):
    """Apply a validated change; the next run moves to now + the (new) interval. Returns the schedule."""
    errors = schedule_errors(data)
    if errors:
        raise FieldErrors(errors)
    schedule = schedule_for(cluster)
    for field, value in data.items():
        setattr(schedule, field, value)
    schedule.next_run = timezone.now() + timedelta(minutes=schedule.every_minutes)
    schedule.save()
    return schedule


def run_due_scans(now=None):
    """Start the scans whose time has come; returns {cluster id: outcome}."""
    now = now or timezone.now()
    outcomes = {}
    due = HealthSchedule.objects.filter(
        enabled=True, next_run__lte=now, cluster__status__in=ClusterStatus.watched()
    ).select_related("cluster", "cluster__project")
    for schedule in due:
        outcomes[schedule.cluster_id] = run_one(schedule, now)
    return outcomes


def run_one(schedule, now):
    # Claim: only the process that moves next_run from the value it read starts the scan.
    claimed = HealthSchedule.objects.filter(pk=schedule.pk, next_run=schedule.next_run).update(
        next_run=now + timedelta(minutes=schedule.every_minutes), last_run=now
    )
    if not claimed:
        return "claimed elsewhere"
    cluster, retry = schedule.cluster, None
    if schedule.idle_only and not targets(cluster, idle_only=True)[0]:
        outcome, retry = "skipped: no idle node; trying again in an hour", NO_IDLE_RETRY
    else:
        hours = schedule.every_minutes / 60
        try:
            operation = start_scan(
                cluster=cluster,
                checks=schedule.checks or None,
                idle_only=schedule.idle_only,
                reason=f"on schedule (every {hours:g} h)",
            )
            outcome = f"started scan {operation.uuid}"
        except Conflict:
            outcome, retry = "skipped: another operation was running; trying again in 5 minutes", BUSY_RETRY
        except FieldErrors as exc:
            outcome = f"skipped: {exc}"
    fields = {"last_outcome": outcome[:300]}
    if retry:
        fields["next_run"] = now + min(retry, timedelta(minutes=schedule.every_minutes))
    HealthSchedule.objects.filter(pk=schedule.pk).update(**fields)
    return outcome
