"""Training runs: a recipe launched on a cluster as one Slurm batch job."""

import uuid

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from clusters.models import compare_and_set


class RunStatus(models.TextChoices):
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
    """A trained model registered from a run's checkpoint: name + version, within a project."""

    project = models.ForeignKey("clusters.Project", models.CASCADE, related_name="model_versions")
    name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField()
    run = models.ForeignKey(Run, models.PROTECT, related_name="model_versions")
    family = models.CharField(max_length=20)
    checkpoint = models.CharField(max_length=500)
    step = models.PositiveIntegerField()
    final_loss = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [models.UniqueConstraint(fields=["project", "name", "version"], name="unique_model_version")]

    def __str__(self):
        return f"{self.name} v{self.version}"
