"""Runs: a recipe launched as a Slurm job (launch), followed by the Slurm sync's hook (follow), shown on
its pages and API (summary). Pages, the API and tasks call these functions."""

from . import keep  # noqa: F401 (registers the DELETE operation's first step: the runs' files kept)
from .follow import cancel_run, in_run, latest_checkpoint, read_progress, refresh_run, result_of, run_status, sync_runs
from .launch import HubFolder, launch_run, preview, validate_launch
from .summary import layout_summary, log_view, metrics, summary

__all__ = [
    "HubFolder",
    "cancel_run",
    "in_run",
    "latest_checkpoint",
    "launch_run",
    "layout_summary",
    "log_view",
    "metrics",
    "preview",
    "read_progress",
    "refresh_run",
    "result_of",
    "run_status",
    "summary",
    "sync_runs",
    "validate_launch",
]
