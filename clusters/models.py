"""Projects, clusters, their node pools, partitions and nodes, operations and the event timeline."""

import uuid
from collections.abc import Mapping
from functools import cached_property

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from .choices import (
    CLUSTER_STATUS_COLOURS,
    EVENT_LEVEL_COLOURS,
    NODE_STATE_COLOURS,
    OPERATION_STATUS_COLOURS,
    ClusterStatus,
    EventLevel,
    NodeRole,
    NodeState,
    OperationStatus,
    Role,
)
from .slurm.states import node_colour


def compare_and_set(row, *, expected, **fields):
    """Write `fields` to the row only while its status is one of `expected` (a status transition that
    two workers cannot both make); on success the instance shows them too. Returns whether it moved."""
    moved = type(row).objects.filter(pk=row.pk, status__in=expected).update(**fields)
    if moved:
        for name, value in fields.items():
            setattr(row, name, value)
    return bool(moved)


class Project(models.Model):
    """The unit of access: a user sees the clusters of the projects they are a member of."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="projects", blank=True, through="Membership"
    )
    # The Google Cloud project the gce backend creates this project's clusters in.
    gcp_project_id = models.CharField(max_length=30, blank=True)
    # Limits across the project's live clusters; empty means no limit.
    node_quota = models.PositiveIntegerField(null=True, blank=True, help_text="Nodes (login and compute), all clusters")
    gpu_quota = models.PositiveIntegerField(null=True, blank=True, help_text="GPUs, all clusters")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug


class Membership(models.Model):
    """A user's role in a project. `project.members.add(user)` makes a viewer; say the role otherwise
    (`through_defaults={"role": Role.ADMIN}`)."""

    project = models.ForeignKey(Project, models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")]
        ordering = ["project", "user__username"]

    def __str__(self):
        return f"{self.user} in {self.project}: {self.role}"


class ClusterQuerySet(models.QuerySet):
    # What a user may see is clusters.access's to say (memberships, a token's project and read-only cap).
    def live(self):
        return self.exclude(status=ClusterStatus.DELETED)


class Cluster(models.Model):
    project = models.ForeignKey(Project, models.CASCADE, related_name="clusters")
    # The cluster's id within its project (the service's model_development_cluster_id).
    name = models.SlugField(max_length=63)
    location = models.CharField(max_length=63, blank=True)
    backend = models.CharField(max_length=32)
    # The spec exactly as accepted (snake_case), the source of truth for what the cluster should be.
    spec = models.JSONField()
    status = models.CharField(max_length=16, choices=ClusterStatus.choices, default=ClusterStatus.DRAFT)
    status_message = models.CharField(max_length=500, blank=True)
    # Whatever the backend needs to find its resources again (directories, ports, resource names).
    backend_state = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["project__slug", "name"]
        constraints = [
            # A deleted cluster frees its id; a failed one keeps it until it is deleted.
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=~Q(status=ClusterStatus.DELETED),
                name="unique_live_cluster_name",
            )
        ]

    def __str__(self):
        return f"{self.project.slug}/{self.name}"

    def get_absolute_url(self):
        return reverse("cluster-detail", args=[self.project.slug, self.name])

    @property
    def display_name(self) -> str:
        return self.spec.get("display_name", self.name)

    @property
    def description(self) -> str:
        return self.spec.get("description") or ""

    @property
    def labels(self) -> dict:
        return self.spec.get("labels") or {}

    @property
    def status_colour(self):
        return CLUSTER_STATUS_COLOURS[self.status]

    @property
    def is_busy(self):
        return self.status in ClusterStatus.busy()

    @property
    def is_usable(self):
        return self.status in ClusterStatus.usable()

    @property
    def is_deletable(self):
        return self.status in ClusterStatus.deletable()

    @property
    def is_deleted(self):
        return self.status == ClusterStatus.DELETED

    def set_status(self, new, *, expected, message=""):
        """Compare-and-set: move to `new` only from one of `expected`; returns whether it moved."""
        return compare_and_set(
            self, expected=expected, status=new, status_message=message[:500], updated=timezone.now()
        )

    def active_operation(self):
        """The operation holding the cluster now (an exclusive one: create, resize, delete, scan, repair)."""
        return self.operations.filter(status__in=OperationStatus.active(), exclusive=True).order_by("created").first()

    def latest_operation(self):
        """The latest operation on the cluster itself (a recipe launch shows on its run's page instead)."""
        return self.operations.filter(exclusive=True).order_by("-created").first()

    def wanted_nodes(self):
        return self.nodes.filter(state__in=NodeState.wanted())

    def compute_nodes(self):
        return self.wanted_nodes().filter(node_pool__role=NodeRole.COMPUTE)

    def starting_nodes(self):
        """Compute nodes the running create, resize or replacement is bringing up."""
        return self.compute_nodes().filter(state=NodeState.PROVISIONING)


class NodePool(models.Model):
    """A group of identical machines (the spec's node_pools[]); the login pool is one too."""

    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="node_pools")
    pool_id = models.CharField(max_length=63)
    role = models.CharField(max_length=8, choices=NodeRole.choices, default=NodeRole.COMPUTE)
    machine_type = models.CharField(max_length=63)
    accelerator_type = models.CharField(max_length=63, blank=True)
    accelerator_count = models.PositiveIntegerField(default=0)
    node_count = models.PositiveIntegerField()
    zone = models.CharField(max_length=63, blank=True)
    provisioning_model = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["cluster", "role", "pool_id"]
        constraints = [models.UniqueConstraint(fields=["cluster", "pool_id"], name="unique_pool_per_cluster")]

    def __str__(self):
        return f"{self.cluster}:{self.pool_id}"


class Partition(models.Model):
    """A Slurm partition over one or more node pools."""

    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=63)
    node_pools = models.ManyToManyField(NodePool, related_name="partitions")
    is_default = models.BooleanField(default=False)

    class Meta:
        ordering = ["cluster", "-is_default", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="unique_partition_per_cluster")]

    def __str__(self):
        return f"{self.cluster}:{self.name}"


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="nodes")
    node_pool = models.ForeignKey(NodePool, models.CASCADE, related_name="nodes")
    # The Slurm node name (NodeName=), unique within the cluster.
    name = models.CharField(max_length=100)
    index = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.PENDING)
    slurm_state = models.CharField(max_length=64, blank=True)
    slurm_reason = models.CharField(max_length=500, blank=True)
    slurm_seen = models.DateTimeField(null=True, blank=True)
    # {failure kind: repair actions taken so far}; carried over to a replacement node, so a failure
    # that follows the position (a bad slot, a bad image) exhausts the ladder instead of looping.
    repairs = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["cluster", "node_pool__pool_id", "index"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="unique_node_per_cluster")]
        # Breaking nodes on purpose is for whoever tests the console's repairs, not every staff member.
        permissions = [("inject_faults", "Can inject faults into nodes")]

    def __str__(self):
        return self.name

    @property
    def state_colour(self):
        return NODE_STATE_COLOURS[self.state]

    @property
    def slurm_colour(self):
        return node_colour(self.slurm_state)

    @property
    def partition_names(self):
        return [p.name for p in self.node_pool.partitions.all()]


class Operation(models.Model):
    """One piece of work on a cluster (a create, resize, delete, scan, repair...): created before it is
    enqueued, then worked by one task at a time (see clusters.operations).

    `params` is what it was asked to do, written once at start and never changed; what its steps
    record as they go (a submitted job id, the nodes a hold covers, the steps done) is its
    `checkpoint`, one key at a time."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="operations")
    # A kind registered with the operations engine (clusters.operations.registry), e.g. "CREATE".
    kind = models.CharField(max_length=32)
    status = models.CharField(max_length=10, choices=OperationStatus.choices, default=OperationStatus.PENDING)
    progress = models.PositiveSmallIntegerField(default=0)
    step = models.CharField(max_length=200, blank=True)
    # [{"at": iso time, "step": name, "message": text}], appended as steps finish.
    log = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    # What the operation is asked to do, e.g. the previous spec of an update; immutable.
    params = models.JSONField(default=dict, blank=True)
    # Its kind's `exclusive` when it started: only exclusive operations count towards the one active
    # operation a cluster may have.
    exclusive = models.BooleanField(default=True)
    # Which claim this is (1 for the first worker, 2 for the one that resumed it, ...): a worker only
    # writes to the operation while its claim is the current one.
    attempts = models.PositiveIntegerField(default=0)
    heartbeat = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Waiting for cloud capacity (a stockout): since when, and not to be tried again before when. A
    # capacity wait does not use up the attempts: it lasts OPERATION_CAPACITY_WAIT_HOURS.
    waiting_since = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        constraints = [
            # One operation at a time per cluster, decided by the database: a resize or delete during a
            # scan (or two requests racing) cannot both insert an active row. Launches are not counted.
            models.UniqueConstraint(
                fields=["cluster"],
                condition=Q(status__in=["PENDING", "RUNNING"], exclusive=True),
                name="one_active_operation_per_cluster",
            )
        ]
        # A cluster's operations newest first, by kind (the scans list, repairs, the latest operation).
        indexes = [models.Index(fields=["cluster", "kind", "-created"], name="operations_by_kind")]

    def __str__(self):
        return f"{self.kind.lower()} {self.cluster} ({self.status})"

    @property
    def is_done(self):
        return self.status in OperationStatus.done()

    @property
    def status_colour(self):
        return OPERATION_STATUS_COLOURS[self.status]

    @cached_property
    def checkpoint(self):
        return Checkpoint(self)

    def refresh_from_db(self, *args, **kwargs):
        super().refresh_from_db(*args, **kwargs)
        self.__dict__.pop("checkpoint", None)

    def claim(self, stale_before):
        """Compare-and-set: take a pending operation, or a running one whose worker went silent."""
        claimed = (
            Operation.objects.filter(pk=self.pk)
            .filter(Q(status=OperationStatus.PENDING) | Q(status=OperationStatus.RUNNING, heartbeat__lt=stale_before))
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=timezone.now()))
            .update(
                status=OperationStatus.RUNNING,
                attempts=F("attempts") + 1,
                heartbeat=timezone.now(),
                started=timezone.now(),
            )
        )
        if claimed:
            self.refresh_from_db()
        return bool(claimed)

    def _mine(self, attempt):
        """This operation's row while it is running under claim `attempt`."""
        return Operation.objects.filter(pk=self.pk, status=OperationStatus.RUNNING, attempts=attempt)

    def beat(self, *, attempt, step):
        """Prove the worker holding claim `attempt` is alive; False when another worker took it over."""
        now = timezone.now()
        moved = self._mine(attempt).update(heartbeat=now, step=step[:200])
        if moved:
            self.heartbeat, self.step = now, step[:200]
        return bool(moved)

    def report(self, *, attempt, progress, step, message=""):
        """Record progress (and a heartbeat); appends to the step log when given a message. False when
        another worker took the operation over."""
        now = timezone.now()
        fields = {"progress": progress, "step": step[:200], "heartbeat": now}
        if message:
            fields["log"] = [*self.log, {"at": now.isoformat(), "step": step, "message": message}]
        moved = self._mine(attempt).update(**fields)
        if moved:
            for key, value in fields.items():
                setattr(self, key, value)
        return bool(moved)

    def finish(self, status, *, error="", attempt=None):
        """Compare-and-set to SUCCEEDED or FAILED from an active status (and, with `attempt`, only under
        that claim); returns whether it moved."""
        rows = Operation.objects.filter(pk=self.pk, status__in=OperationStatus.active())
        if attempt is not None:
            rows = rows.filter(attempts=attempt)
        moved = rows.update(
            status=status,
            error=error,
            progress=100 if status == OperationStatus.SUCCEEDED else F("progress"),
            finished=timezone.now(),
            heartbeat=timezone.now(),
        )
        self.refresh_from_db()
        return bool(moved)

    def release(self, message, *, attempt):
        """Hand a running operation back to PENDING so a retry can claim it."""
        self.log = [*self.log, {"at": timezone.now().isoformat(), "step": self.step, "message": message}]
        self._mine(attempt).update(status=OperationStatus.PENDING, log=self.log)

    def wait_for_capacity(self, message, *, attempt, since, retry_at):
        """Hand it back to PENDING until `retry_at`, without spending an attempt (a stockout is waited
        out for hours, not retried a few times), saying on its step what it waits for."""
        self.log = [*self.log, {"at": timezone.now().isoformat(), "step": self.step, "message": message}]
        self._mine(attempt).update(
            status=OperationStatus.PENDING,
            log=self.log,
            attempts=F("attempts") - 1,
            waiting_since=since,
            not_before=retry_at,
            step=message[:200],
        )


class OperationCheckpoint(models.Model):
    """One key of what an operation's steps recorded (a submitted job id, held nodes, steps done), so a
    rerun after a crash resumes instead of redoing; written one key at a time."""

    operation = models.ForeignKey(Operation, models.CASCADE, related_name="checkpoints")
    key = models.CharField(max_length=64)
    value = models.JSONField(null=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["operation", "key"], name="one_value_per_checkpoint_key")]

    def __str__(self):
        return f"{self.operation_id}:{self.key}"


class Checkpoint(Mapping):
    """An operation's checkpoint as a read-only mapping, with `set(key, value)` to record one key."""

    def __init__(self, operation):
        self._operation = operation
        self._values = None

    def _loaded(self):
        if self._values is None:
            # .all(), not values_list(): a list of operations can prefetch_related("checkpoints").
            self._values = {row.key: row.value for row in self._operation.checkpoints.all()}
        return self._values

    def __getitem__(self, key):
        return self._loaded()[key]

    def __iter__(self):
        return iter(self._loaded())

    def __len__(self):
        return len(self._loaded())

    def set(self, key, value):
        OperationCheckpoint.objects.update_or_create(operation=self._operation, key=key, defaults={"value": value})
        self._loaded()[key] = value
        return value


class ClusterEvent(models.Model):
    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="events")
    operation = models.ForeignKey(Operation, models.SET_NULL, null=True, blank=True, related_name="events")
    node = models.CharField(max_length=100, blank=True)
    level = models.CharField(max_length=8, choices=EventLevel.choices, default=EventLevel.INFO)
    message = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]
        # The timeline pages read a cluster's newest events (benchmarks/history_growth.py).
        indexes = [models.Index(fields=["cluster", "-created", "-id"], name="events_timeline")]

    def __str__(self):
        return self.message[:80]

    @property
    def level_colour(self):
        return EVENT_LEVEL_COLOURS[self.level]


class SlurmJob(models.Model):
    """Every Slurm job the console has seen on a cluster, so the history outlives Slurm's own memory."""

    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="slurm_jobs")
    job_id = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    user = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=32)
    partition = models.CharField(max_length=63, blank=True)
    nodes = models.CharField(max_length=500, blank=True)
    node_count = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=200, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    submit_time = models.DateTimeField(null=True, blank=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)
    seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-job_id"]
        constraints = [models.UniqueConstraint(fields=["cluster", "job_id"], name="unique_job_per_cluster")]

    def __str__(self):
        return f"{self.cluster}#{self.job_id}"

    @property
    def elapsed(self):
        """Seconds run so far (or in all, once ended); None before it starts."""
        if self.start_time is None:
            return None
        end = self.end_time if self.end_time and self.end_time >= self.start_time else timezone.now()
        return int((end - self.start_time).total_seconds())


class SlurmSync(models.Model):
    """When the periodic sync last pulled the cluster's nodes and jobs from Slurm, and since when Slurm
    has not answered. Pages read this beside the rows the sync wrote ("as of HH:MM:SS")."""

    cluster = models.OneToOneField(Cluster, models.CASCADE, primary_key=True, related_name="slurm_sync")
    synced = models.DateTimeField(null=True, blank=True)  # the last sync that reached Slurm
    attempted = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)  # first failure of the current run of them
    error = models.CharField(max_length=500, blank=True)
    # A sync holds the cluster until then (compare-and-set), so two workers never sync it at once.
    claimed_until = models.DateTimeField(null=True, blank=True)
    nodes_written = models.PositiveIntegerField(default=0)  # rows the last sync changed
    jobs_written = models.PositiveIntegerField(default=0)

    def __str__(self):
        return f"sync of {self.cluster_id}"

    def is_stale(self, now=None):
        """No sync has reached Slurm within SLURM_STALE_SECONDS (or Slurm is failing now)."""
        now = now or timezone.now()
        if self.failing_since or self.synced is None:
            return True
        return (now - self.synced).total_seconds() > settings.SLURM_STALE_SECONDS


class HealthResult(models.Model):
    """One check's result on one node in one scan (an Operation of kind SCAN)."""

    operation = models.ForeignKey(Operation, models.CASCADE, related_name="health_results")
    cluster = models.ForeignKey(Cluster, models.CASCADE, related_name="health_results")
    node = models.CharField(max_length=100)
    check_name = models.CharField(max_length=50)
    status = models.CharField(max_length=10)
    values = models.JSONField(default=dict)
    threshold = models.JSONField(default=dict)
    reason = models.CharField(max_length=500, blank=True)
    # Where the repair of this failure starts on the ladder when not at its first rung ("replace": a GPU
    # that meets NVIDIA's RMA criteria; a reboot cannot fix it). Blank: the ladder's order.
    repair = models.CharField(max_length=20, blank=True)
    created = models.DateTimeField(default=timezone.now)
    # The newest result of its node and check: the health grid and the outstanding failures read only
    # these (one row per node and check, however long the history), so a 5 s poll stays cheap.
    latest = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "check_name"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "node", "check_name"], name="unique_result_per_scan")
        ]
        indexes = [
            # A node's history of a check (the node page).
            models.Index(fields=["cluster", "node", "check_name", "id"], name="result_history"),
            models.Index(fields=["cluster"], condition=models.Q(latest=True), name="latest_results"),
        ]

    def __str__(self):
        return f"{self.node} {self.check_name}: {self.status}"

    @property
    def colour(self):
        return {"pass": "green", "warn": "amber", "fail": "red"}.get(self.status, "grey")


class HealthSchedule(models.Model):
    """A cluster's periodic health scan: every `every_minutes`, the chosen checks, on idle nodes by default."""

    cluster = models.OneToOneField(Cluster, models.CASCADE, related_name="health_schedule")
    enabled = models.BooleanField(default=True)
    every_minutes = models.PositiveIntegerField(default=24 * 60)
    # Check names; empty means every check.
    checks = models.JSONField(default=list, blank=True)
    # Scan only nodes with no jobs, so a schedule never waits behind (or slows) a training run.
    idle_only = models.BooleanField(default=True)
    next_run = models.DateTimeField(null=True, blank=True)
    last_run = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=300, blank=True)

    def __str__(self):
        return f"{self.cluster} every {self.every_minutes} min"
