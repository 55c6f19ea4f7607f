"""The failure policy (policy.json): each failure's priority and its ladder of repair actions, and the
drain-reason prefix by which the console recognises the nodes it took out of service."""

import json
from functools import cache
from pathlib import Path

REASON_PREFIX = "tcc "
GAVE_UP = "gave up"


@cache
def policy():
    return json.loads((Path(__file__).resolve().parent / "policy.json").read_text())["failures"]


def worst(failures):
    """The failure that wins when a node has several: the highest priority."""
    return max(failures, key=lambda f: policy()[f]["priority"])


@cache
def actions():
    """Every action some ladder takes."""
    return frozenset(action for failure in policy().values() for action in failure["ladder"])


def next_action(node, failure, start_at=""):
    """The ladder's next rung for the node's failure (each rung is tried once), or None when none is left;
    `start_at` (a check's Result.repair) skips the rungs before it."""
    ladder = policy()[failure]["ladder"]
    taken = node.repairs.get(failure, 0)
    if start_at in ladder:
        taken = max(taken, ladder.index(start_at))
    return ladder[taken] if taken < len(ladder) else None
