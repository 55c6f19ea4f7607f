"""Training runs: a recipe launched on a cluster as one Slurm batch job."""

import uuid
from datetime import datetime

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from clusters.choices import ClusterStatus
from clusters.models import compare_and_set


class RunStatus(models.TextChoices):
    # Its LAUNCH operation is staging, writing and submitting it; no Slurm job yet.
    SUBMITTING = "SUBMITTING", "Submitting"
    QUEUED = "QUEUED", "Queued"
    RUNNING = "RUNNING", "Running"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"

    @classmethod
    def active(cls):
        return {cls.QUEUED, cls.RUNNING}

    @classmethod
    def done(cls):
        return {cls.COMPLETED, cls.FAILED, cls.CANCELLED}


RUN_STATUS_COLOURS = {
    RunStatus.SUBMITTING: "grey",
    RunStatus.QUEUED: "grey",
    RunStatus.RUNNING: "blue",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "amber",
}


class Run(models.Model):
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cluster = models.ForeignKey("clusters.Cluster", models.CASCADE, related_name="runs")
    recipe_id = models.CharField(max_length=100)
    profile = models.CharField(max_length=20)
    partition = models.CharField(max_length=63)
    nodes = models.PositiveIntegerField()
    steps = models.PositiveIntegerField()
    # The resolved config train.py reads, and the exact sbatch script submitted.
    config = models.JSONField()
    script = models.TextField()
    work_dir = models.CharField(max_length=500)
    init_from = models.ForeignKey("self", models.SET_NULL, null=True, blank=True, related_name="continued_by")
    status = models.CharField(max_length=10, choices=RunStatus.choices, default=RunStatus.QUEUED)
    # The LAUNCH operation that submitted it (its progress shows on the run page while SUBMITTING).
    launch = models.ForeignKey(
        "clusters.Operation", models.SET_NULL, null=True, blank=True, related_name="launched_runs"
    )
    slurm_job_id = models.PositiveIntegerField(null=True, blank=True)
    slurm_state = models.CharField(max_length=32, blank=True)
    slurm_reason = models.CharField(max_length=200, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Progress as the Slurm sync last read it from the run folder (pages read only these).
    metrics_offset = models.PositiveBigIntegerField(default=0)  # bytes of metrics.jsonl already stored
    log_tail = models.TextField(blank=True)
    progress_synced = models.DateTimeField(null=True, blank=True)
    metrics_seen = models.DateTimeField(null=True, blank=True)  # when the sync last found new metrics lines
    # What the sync watches for (recipes/runs/alerts.py): {"stall_minutes": N, "cancel_on_nonfinite": bool},
    # from the launch; and the alerts raised, {kind: {"at", "message"}}, each once.
    watch = models.JSONField(default=dict, blank=True)
    alerts = models.JSONField(default=dict, blank=True)
    # The registry: the run's MLflow run (params and metrics logged as it trains), the metric lines
    # already logged there, the model version it started from, and whether it registered by itself.
    init_version = models.ForeignKey(
        "ModelVersion", models.SET_NULL, null=True, blank=True, related_name="continued_by"
    )
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    mlflow_logged = models.PositiveIntegerField(default=0)
    auto_registered = models.BooleanField(default=False)
    # What of the run's files the registry keeps, so the run outlives its cluster (registry/archive.py):
    # {"step": the checkpoint kept, "bytes": its size, "tensorboard": {event file: bytes kept},
    #  "at": when, "skipped": why the newest checkpoint was not kept, if it was not}.
    archive = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.recipe_id} on {self.cluster} ({self.status})"

    def get_absolute_url(self):
        return reverse("run-detail", args=[self.cluster.project.slug, self.cluster.name, self.uuid])

    @property
    def is_done(self):
        return self.status in RunStatus.done()

    @property
    def checkpoint_copy(self):
        """The copy under way of a large checkpoint into the registry (registry/archive.py), with its
        percent sent, or None."""
        copying = (self.archive or {}).get("copying")
        if not copying:
            return None
        percent = min(100, 100 * copying.get("sent", 0) // max(copying.get("bytes", 1), 1))
        return {**copying, "percent": percent, "at": datetime.fromisoformat(copying["at"])}

    def in_home(self, *parts):
        """A path in the run's folder relative to the cluster's shared home (for the cluster agent)."""
        return "/".join(["runs", self.work_dir.rstrip("/").rsplit("/", 1)[-1], *parts])

    @property
    def status_colour(self):
        return RUN_STATUS_COLOURS[self.status]

    def set_status(self, new, *, expected, **fields):
        """Compare-and-set, like the cluster's; returns whether it moved."""
        return compare_and_set(self, expected=expected, status=new, **fields)


class RunMetric(models.Model):
    """One logged step of a run (a line of its metrics.jsonl), stored by the Slurm sync."""

    run = models.ForeignKey(Run, models.CASCADE, related_name="metric_rows")
    line = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    values = models.JSONField()

    class Meta:
        ordering = ["line"]
        constraints = [models.UniqueConstraint(fields=["run", "line"], name="one_metric_per_line")]

    def __str__(self):
        return f"{self.run_id} step {self.step}"


class ModelVersion(models.Model):
    """A registered model version, as the console knows it: the registry (MLflow) holds the version, its
    aliases, tags and artifacts (an exported Hugging Face format folder); this row is the console's index
    of it, scoped to a project, with its lineage kept as names so that it outlives its run and cluster."""

    project = models.ForeignKey("clusters.Project", models.CASCADE, related_name="model_versions")
    name = models.SlugField(max_length=100)  # the console's name; MLflow's is "<project slug>.<name>"
    version = models.PositiveIntegerField()  # MLflow's version number
    run = models.ForeignKey(Run, models.SET_NULL, null=True, blank=True, related_name="model_versions")
    family = models.CharField(max_length=20)
    checkpoint = models.CharField(max_length=500)  # the artifact's URI in the registry's store
    step = models.PositiveIntegerField()
    final_loss = models.FloatField(null=True, blank=True)
    # Lineage: version -> run -> cluster -> recipe -> parent version (kept when the run and cluster go).
    run_uuid = models.UUIDField(null=True, blank=True)
    cluster_name = models.CharField(max_length=63, blank=True)
    recipe_id = models.CharField(max_length=100, blank=True)
    parent = models.ForeignKey("self", models.SET_NULL, null=True, blank=True, related_name="children")
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    size = models.PositiveBigIntegerField(default=0)  # bytes of the artifact
    automatic = models.BooleanField(default=False)  # registered by itself when its run completed
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [models.UniqueConstraint(fields=["project", "name", "version"], name="unique_model_version")]

    def __str__(self):
        return f"{self.name} v{self.version}"

    def get_absolute_url(self):
        return reverse("model-version", args=[self.project.slug, self.name, self.version])

    @property
    def ref(self):
        return f"{self.name}:v{self.version}"

    @property
    def live_run(self):
        """Its run while that run's cluster exists (a deleted cluster's run keeps its page, not its cluster)."""

        run = self.run
        return run if run is not None and run.cluster.status != ClusterStatus.DELETED else None


class EndpointStatus(models.TextChoices):
    STARTING = "STARTING", "Starting"  # no replica answers yet
    READY = "READY", "Ready"
    ROLLING = "ROLLING", "Rolling"  # replicas of a new version are starting; the old ones still serve
    # A replica of the wanted version never served: nothing new starts until a deploy (or an empty
    # PATCH) says to try again; what served before keeps serving.
    FAILED = "FAILED", "Roll failed"
    DELETING = "DELETING", "Deleting"
    DELETED = "DELETED", "Deleted"

    @classmethod
    def live(cls):
        return {cls.STARTING, cls.READY, cls.ROLLING, cls.FAILED}


ENDPOINT_STATUS_COLOURS = {
    EndpointStatus.STARTING: "grey",
    EndpointStatus.READY: "green",
    EndpointStatus.ROLLING: "blue",
    EndpointStatus.FAILED: "red",
    EndpointStatus.DELETING: "amber",
    EndpointStatus.DELETED: "grey",
}


class Endpoint(models.Model):
    """A model version (or whatever version an alias names) served from replicas on one cluster,
    behind the router (recipes/router.py), scaled between min and max replicas on in-flight requests."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    project = models.ForeignKey("clusters.Project", models.CASCADE, related_name="endpoints")
    cluster = models.ForeignKey("clusters.Cluster", models.CASCADE, related_name="endpoints")
    name = models.SlugField(max_length=63)
    model_name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField(null=True, blank=True)  # pinned, or
    alias = models.CharField(max_length=63, blank=True)  # followed: moving the alias rolls the endpoint
    serving = models.ForeignKey(ModelVersion, models.SET_NULL, null=True, blank=True, related_name="endpoints")
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=1)
    target_in_flight = models.FloatField(default=2.0)  # per replica; above it scales up
    target_p95_ms = models.FloatField(null=True, blank=True)  # optional: a p95 latency above it scales up too
    desired_replicas = models.PositiveIntegerField(default=1)
    # GPUs of one node each replica takes (vLLM's tensor parallel size); 0 on a partition without GPUs.
    gpus_per_replica = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=10, choices=EndpointStatus.choices, default=EndpointStatus.STARTING)
    # The version whose roll failed (FAILED) and why: not tried again until the endpoint is changed.
    failed_version = models.ForeignKey(ModelVersion, models.SET_NULL, null=True, blank=True, related_name="+")
    failure = models.CharField(max_length=300, blank=True)
    # Replicas serving when the current roll began: it keeps at least min(this, desired) serving.
    roll_serving = models.PositiveIntegerField(null=True, blank=True)
    # The STAGE operation copying the wanted version onto the cluster (recipes/registry/staging.py).
    staging = models.ForeignKey("clusters.Operation", models.SET_NULL, null=True, blank=True, related_name="+")
    last_scaled = models.DateTimeField(null=True, blank=True)
    # A reconcile round holds the endpoint until then (compare-and-set), so two workers never drive it at
    # once (two rounds would each start the replica it lacks).
    reconciling_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=~models.Q(status="DELETED"),
                name="one_live_endpoint_per_name",
            )
        ]

    def __str__(self):
        return f"{self.project.slug}/{self.name}"

    def get_absolute_url(self):
        return reverse("endpoint-detail", args=[self.project.slug, self.name])

    @property
    def target(self):
        return f"{self.model_name}@{self.alias}" if self.alias else f"{self.model_name}:v{self.version}"

    @property
    def status_colour(self):
        return ENDPOINT_STATUS_COLOURS[self.status]

    def set_status(self, new, *, expected, **fields):
        return compare_and_set(self, expected=expected, status=new, **fields)

    def roll_progress(self):
        """The roll under way (replicas of another version still run beside the wanted one's), or None:
        {"to", "ready", "wanted", "old", "draining", "percent"}, the percent counting each new replica
        ready and each old one stopped (recipes/serving/reconcile.py drains one old for each new ready)."""
        if self.serving_id is None or self.status == EndpointStatus.FAILED:
            return None
        running = list(self.replicas.filter(state__in=ReplicaState.running()).values_list("version_id", "state"))
        old = [state for version, state in running if version != self.serving_id]
        if not old:
            return None
        wanted = max(1, self.desired_replicas)
        ready = min(wanted, sum(v == self.serving_id and state == ReplicaState.READY for v, state in running))
        draining = old.count(ReplicaState.DRAINING)
        return {"to": self.serving.ref, "ready": ready, "wanted": wanted, "old": len(old) - draining,
                "draining": draining, "percent": 100 * ready // (wanted + len(old))}  # fmt: skip


class ReplicaState(models.TextChoices):
    STARTING = "STARTING", "Starting"  # its Slurm job is queued or loading the model
    READY = "READY", "Ready"  # answers /health: the router sends it requests
    DRAINING = "DRAINING", "Draining"  # no new requests; stopped once the in-flight ones are done
    STOPPED = "STOPPED", "Stopped"
    FAILED = "FAILED", "Failed"

    @classmethod
    def routed(cls):
        return {cls.READY}

    @classmethod
    def running(cls):
        return {cls.STARTING, cls.READY, cls.DRAINING}


class Replica(models.Model):
    endpoint = models.ForeignKey(Endpoint, models.CASCADE, related_name="replicas")
    version = models.ForeignKey(ModelVersion, models.SET_NULL, null=True, blank=True, related_name="replicas")
    version_ref = models.CharField(max_length=120)
    slurm_job_id = models.PositiveIntegerField(null=True, blank=True)
    folder = models.CharField(max_length=300)  # relative to the cluster's shared home
    host = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    node = models.CharField(max_length=100, blank=True)  # the Slurm node its job runs on
    # The bearer token the replica wants on every path but /health: made by the console, written to a 0600
    # file of the job's account, sent by the router alone; never on a page, an answer or a log line.
    token = models.CharField(max_length=64, blank=True, editable=False)
    state = models.CharField(max_length=10, choices=ReplicaState.choices, default=ReplicaState.STARTING)
    error = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    draining_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created"]

    def __str__(self):
        return f"{self.endpoint} replica {self.pk} ({self.state})"

    @property
    def url(self):
        return f"http://{self.host}:{self.port}" if self.host and self.port else ""

    def set_state(self, new, *, expected, **fields):
        """Compare-and-set on the replica's state; returns whether it moved."""
        moved = Replica.objects.filter(pk=self.pk, state__in=expected).update(state=new, **fields)
        if moved:
            self.state = new
            for key, value in fields.items():
                setattr(self, key, value)
        return bool(moved)


class EndpointSample(models.Model):
    """What the router saw for one endpoint over one interval (ROUTER_SAMPLE_SECONDS)."""

    endpoint = models.ForeignKey(Endpoint, models.CASCADE, related_name="samples")
    time = models.DateTimeField(db_index=True)
    seconds = models.FloatField()
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    p50_ms = models.FloatField(null=True, blank=True)
    p95_ms = models.FloatField(null=True, blank=True)
    in_flight = models.FloatField(default=0)  # mean requests in flight over the interval
    queued = models.PositiveIntegerField(default=0)  # most requests waiting at once for a free replica
    replicas = models.PositiveIntegerField(default=0)  # routed replicas

    class Meta:
        ordering = ["time"]

    def __str__(self):
        return f"{self.endpoint_id} at {self.time:%H:%M:%S}"

    @property
    def requests_per_s(self):
        return self.requests / self.seconds if self.seconds else 0.0


class EndpointEvent(models.Model):
    endpoint = models.ForeignKey(Endpoint, models.CASCADE, related_name="events")
    time = models.DateTimeField(default=timezone.now)
    message = models.CharField(max_length=500)

    class Meta:
        ordering = ["-time"]

    def __str__(self):
        return self.message
