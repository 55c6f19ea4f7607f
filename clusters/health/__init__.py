"""Health checks as plugins: each module in clusters/health/checks/ registers one check by name.

A check runs on a node (inside a Slurm job step, see agent.py) and returns a Result: pass, warn,
fail, or skipped with a reason, plus what it measured and the threshold it used. Thresholds live in
clusters/health/thresholds.json.
"""

import json
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

    def as_dict(self):
        return asdict(self)


def check(name):
    """Register a check function `fn(context) -> Result` under `name`."""

    def register(fn):
        CHECKS[name] = fn
        return fn

    return register


@cache
def thresholds():
    return json.loads((Path(__file__).resolve().parent / "thresholds.json").read_text())


def load_checks():
    from .checks import correctness, dcgm, disk, ecc, gpu_inventory, interconnect, speed  # noqa: F401

    return CHECKS
