"""One vocabulary of Slurm states, named once for backends, health, recipes, models and templates.

Node states are what `sinfo --json` reports: a base state (lower case) and flags; the console keeps
them joined as "base+flag+flag" (e.g. "idle+drain", "down+not_responding"). Job states are
`squeue --json`'s `job_state` (upper case).
"""

from dataclasses import dataclass, field

# -- nodes ------------------------------------------------------------------------------------

# Up and answering: a job can start on such a node (unless a flag says otherwise).
NODE_UP = frozenset({"idle", "mixed", "allocated"})
# Base states on which no new job starts.
NODE_UNSCHEDULABLE = frozenset({"down", "drained", "draining", "drain", "fail", "failing", "unknown"})
# Flags on which no new job starts, whatever the base state.
FLAGS_UNSCHEDULABLE = frozenset({"drain", "not_responding"})

SLURM_NODE_STATE_COLOURS = {
    "idle": "green",
    "mixed": "green",
    "allocated": "blue",
    "completing": "blue",
    "down": "red",
    "drain": "amber",
    "drained": "amber",
    "draining": "amber",
    "fail": "red",
    "future": "grey",
    "unknown": "grey",
}


def split_state(display_state):
    """(base, {flags}) of a stored node state such as "idle+drain" (lower case); unknown when empty."""
    base, *flags = (display_state or "unknown").lower().split("+")
    return base, set(flags)


def is_down(display_state):
    return split_state(display_state)[0] == "down"


def is_drained(display_state):
    """Drained or draining: by its base state, or the drain flag on another base state."""
    base, flags = split_state(display_state)
    return "drain" in flags or base in ("drain", "drained", "draining")


def is_schedulable(display_state):
    base, flags = split_state(display_state)
    return base not in NODE_UNSCHEDULABLE and not flags & FLAGS_UNSCHEDULABLE


def node_colour(display_state):
    return SLURM_NODE_STATE_COLOURS.get(split_state(display_state)[0], "grey")


# -- jobs -------------------------------------------------------------------------------------

# Waiting to run; a preempted or requeued job of the console's (submitted with --requeue) waits again.
JOB_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "PREEMPTED"})
JOB_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
JOB_ACTIVE = JOB_WAITING | JOB_RUNNING
JOB_COMPLETED = frozenset({"COMPLETED"})
JOB_CANCELLED = frozenset({"CANCELLED"})
JOB_FAILED = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


def is_active(job_state):
    return job_state in JOB_ACTIVE


# -- what backends report ---------------------------------------------------------------------


@dataclass
class NodeStatus:
    name: str
    state: str  # Slurm's base state, lower case: idle, allocated, mixed, down, drained, ...
    flags: list = field(default_factory=list)  # DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    partitions: list = field(default_factory=list)
    cpus: int = 0
    memory_mb: int = 0
    slurmd_start_time: int = 0  # when the node's current slurmd registered (0: never)
    address: str = ""  # NodeAddr: where other machines reach the node

    @property
    def display_state(self):
        return "+".join([self.state, *[f.lower() for f in self.flags]])

    @property
    def is_up(self):
        """Registered and answering: idle, mixed or allocated, and not flagged NOT_RESPONDING."""
        return self.state in NODE_UP and "NOT_RESPONDING" not in self.flags


@dataclass
class JobStatus:
    job_id: int
    name: str
    user: str
    state: str
    partition: str
    nodes: str
    node_count: int
    reason: str = ""
    exit_code: int | None = None
    submit_time: int = 0
    start_time: int = 0
    end_time: int = 0

    @property
    def is_active(self):
        return self.state in JOB_ACTIVE
