"""Health checks as plugins: each module in clusters/health/checks/ registers one check by name.

A check runs on a node (inside a Slurm job step, see agent.py) and returns a Result: pass, warn,
fail, or skipped with a reason, plus what it measured and the threshold it used. Thresholds live in
clusters/health/thresholds.json.
"""

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

PASS, WARN, FAIL, SKIPPED = "pass", "warn", "fail", "skipped"
STATUSES = (PASS, WARN, FAIL, SKIPPED)
CHECKS = {}
# Checks every node of a scan job runs together (a collective); the agent runs them after the rest.
COLLECTIVE = {"interconnect"}


@dataclass
class Result:
    status: str
    values: dict = field(default_factory=dict)
    threshold: dict = field(default_factory=dict)
    reason: str = ""
    # The rung of the failure's ladder (policy.json) a failure starts from when the check knows the
    # earlier ones cannot help: "replace" for a GPU that meets NVIDIA's RMA criteria (no reset fixes it).
    repair: str = ""

    def as_dict(self):
        return asdict(self)


def check(name):
    """Register a check function `fn(context) -> Result` under `name`."""

    def register(fn):
        CHECKS[name] = fn
        return fn

    return register


@cache
def default_thresholds():
    return json.loads((Path(__file__).resolve().parent / "thresholds.json").read_text())


def thresholds(context=None):
    """The data file's thresholds, then its layer for the scan's backend (`context["backend"]`), then
    the scan's own overrides (`context["thresholds"]`)."""
    context = context or {}
    merged = {name: value for name, value in default_thresholds().items() if not name.startswith("_")}
    layers = [default_thresholds()["_backends"].get(context.get("backend"), {}), context.get("thresholds") or {}]
    for layer in layers:
        for name, values in layer.items():
            merged[name] = {**merged.get(name, {}), **values}
    return merged


def unknown_checks(checks):
    """A message for each name in `checks` that is not a registered check."""
    known = load_checks()
    return [f"unknown check {c!r}; choose from: {', '.join(known)}" for c in checks if c not in known]


def threshold_errors(overrides):
    """{field path: [reason]} for overrides that are not known thresholds with sensible values."""
    if not isinstance(overrides, dict):
        return {"thresholds": ["must be an object of {check: {threshold: value}}"]}
    defaults, errors = default_thresholds(), {}
    for name, values in overrides.items():
        if name in load_checks() and name not in defaults:
            errors[f"thresholds.{name}"] = ["this check has no thresholds"]
        elif name not in defaults or name.startswith("_"):
            errors[f"thresholds.{name}"] = [f"unknown check; choose from: {', '.join(sorted(load_checks()))}"]
        elif not isinstance(values, dict):
            errors[f"thresholds.{name}"] = ["must be an object of {threshold: value}"]
        else:
            limits = defaults["_limits"].get(name, {})
            for key, value in values.items():
                problem = value_problem(key, value, defaults[name].get(key)) or limit_problem(value, limits.get(key))
                if problem:
                    errors[f"thresholds.{name}.{key}"] = [problem]
    return errors


def limit_problem(value, limit):
    if limit is not None and value > limit:
        return f"must be at most {limit:,} (a bigger value would tie up the scan's worker and nodes)"
    return ""


def value_problem(key, value, default):
    if default is None:
        return "unknown threshold"
    if isinstance(default, dict):
        if not isinstance(value, dict) or set(value) - set(default):
            return f"must be an object with keys from: {', '.join(default)}"
        problems = [value_problem(key, v, default[k]) for k, v in value.items()]
        return next((p for p in problems if p), "")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return "must be a number"
    if isinstance(default, int) and not isinstance(default, bool) and value != int(value):
        return "must be a whole number"
    if value < 0 or (value == 0 and not key.startswith("max_") and not key.startswith("min_")):
        return "must be more than 0"
    if key.endswith("fraction") and value > 1:
        return "must be a fraction between 0 and 1"
    return ""


def this_node():
    """The Slurm node this process runs on (slurmd sets SLURMD_NODENAME for jobs and the epilog)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_faults(context, node):
    """The faults injected into `node` (clusters/health/faults.py), {} when none (or none can be)."""
    path = Path(context.get("faults_dir", "/nonexistent")) / f"{node}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def load_checks():
    from .checks import correctness, dcgm, disk, ecc, gpu_inventory, interconnect, nvlink, speed, xid  # noqa: F401

    return CHECKS
