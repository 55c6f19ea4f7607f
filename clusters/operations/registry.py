"""The kinds of operation the engine runs, each registered by the code that owns it.

A kind says what its operation does (its steps), what the cluster's status is while it runs and
from which statuses it may start, what happens when it succeeds or fails, and how the managed
service's v1beta1 surface names it. The engine knows no kind by name: `clusters.lifecycle` registers
create, update and delete, `clusters.health` registers scan and repair, and may *extend* a kind it
does not own (health adds the first scan to a create or resize).

Every hook takes the operation's context (`engine.Context`): the operation, its cluster, the
cluster's backend, its checkpoint and `heartbeat()`.
"""

from dataclasses import dataclass


def nothing(*args):
    return None


def no_steps(ctx):
    return []


@dataclass(frozen=True)
class Kind:
    name: str  # what Operation.kind holds, e.g. "CREATE"
    label: str  # for people: "Create", "Health scan"
    # The google.rpc metadata message of its v1beta1 operation, e.g. "CreateModelDevelopmentClusterOperationMetadata".
    metadata_type: str
    steps: object  # ctx -> [Step]
    # Cluster statuses it may start in; start() refuses it (409) in any other.
    starts_from: frozenset
    # The cluster's status while it runs (start() moves the cluster there); "" leaves the status alone.
    busy_status: str = ""
    prepare: object = nothing  # ctx -> None, before any step list is built (each attempt)
    on_success: object = nothing  # ctx -> None, after the last step, before the operation is marked done
    after_success: object = nothing  # ctx -> None, once it is marked done (follow-up work may start here)
    on_failure: object = nothing  # (ctx, message) -> None, once it is marked failed
    # What v1beta1 answers once it is done: the cluster resource, or google.protobuf.Empty.
    response: str = "cluster"
    # Whether it holds the cluster: at most one exclusive operation is active per cluster (the database
    # says so), and it is the one the cluster page shows. A kind that only reads the cluster and submits
    # a job (a recipe launch) is not exclusive: several may run beside each other and beside a scan.
    # It must leave the cluster's status alone (busy_status "").
    exclusive: bool = True

    def __post_init__(self):
        if not self.exclusive and self.busy_status:
            raise ValueError(f"{self.name}: a kind that does not hold the cluster cannot move its status")


@dataclass(frozen=True)
class Extension:
    """Work a module adds to a kind it does not own; its hooks run after the kind's own (its steps after the
    kind's steps, its on_success before the kind's, so it can leave a verdict in the checkpoint), except
    `first_steps`, which run before the kind's steps (what must happen while the cluster is still there:
    recipes keep their runs' records before a delete takes the cluster's files away)."""

    first_steps: object = no_steps
    steps: object = no_steps
    prepare: object = nothing
    on_success: object = nothing
    after_success: object = nothing
    on_failure: object = nothing


_kinds = {}
_extensions = {}


def register(kind):
    """Register a kind under its name (again with the same name: replaced, so a module reload is harmless)."""
    _kinds[kind.name] = kind
    return kind


def extend(name, extension):
    """Add `extension` to the kind called `name` (which may be registered later)."""
    _extensions.setdefault(name, [])
    if extension not in _extensions[name]:
        _extensions[name].append(extension)
    return extension


def kind(name):
    """The registered kind; KeyError names the kinds there are."""
    try:
        return _kinds[name]
    except KeyError:
        raise KeyError(f"no operation kind {name!r} is registered; there are: {', '.join(sorted(_kinds))}") from None


def extensions(name):
    return list(_extensions.get(name, []))


def kinds():
    return dict(_kinds)
