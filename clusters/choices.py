"""Status enums with their colours and state groups, named once for models, API, forms and templates."""

from django.db import models


class ClusterStatus(models.TextChoices):
    DRAFT = "DRAFT", "Draft"
    PROVISIONING = "PROVISIONING", "Provisioning"
    # Provisioned, but its first health scan found failures that are being repaired: no jobs yet.
    VERIFYING = "VERIFYING", "Verifying"
    READY = "READY", "Ready"
    DEGRADED = "DEGRADED", "Degraded"
    UPDATING = "UPDATING", "Updating"
    DELETING = "DELETING", "Deleting"
    DELETED = "DELETED", "Deleted"
    FAILED = "FAILED", "Failed"

    @classmethod
    def busy(cls):
        """An operation owns the cluster; no other may start."""
        return {cls.PROVISIONING, cls.UPDATING, cls.DELETING}

    @classmethod
    def usable(cls):
        """Jobs can run; updates may start."""
        return {cls.READY, cls.DEGRADED}

    @classmethod
    def watched(cls):
        """Its nodes are up: the console watches, scans and repairs them."""
        return cls.usable() | {cls.VERIFYING}

    @classmethod
    def synced(cls):
        """Slurm may be up: the periodic sync pulls its nodes and jobs into the database."""
        return cls.watched() | {cls.PROVISIONING, cls.UPDATING}

    @classmethod
    def deletable(cls):
        return {cls.DRAFT, cls.VERIFYING, cls.READY, cls.DEGRADED, cls.FAILED}

    @classmethod
    def live(cls):
        """Everything but DELETED: the cluster's id is taken."""
        return set(cls) - {cls.DELETED}


CLUSTER_STATUS_COLOURS = {
    ClusterStatus.DRAFT: "grey",
    ClusterStatus.PROVISIONING: "blue",
    ClusterStatus.VERIFYING: "amber",
    ClusterStatus.READY: "green",
    ClusterStatus.DEGRADED: "amber",
    ClusterStatus.UPDATING: "blue",
    ClusterStatus.DELETING: "blue",
    ClusterStatus.DELETED: "grey",
    ClusterStatus.FAILED: "red",
}


class OperationKind(models.TextChoices):
    CREATE = "CREATE", "Create"
    UPDATE = "UPDATE", "Update"
    DELETE = "DELETE", "Delete"
    SCAN = "SCAN", "Health scan"
    REPAIR = "REPAIR", "Repair"


class OperationStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"

    @classmethod
    def done(cls):
        return {cls.SUCCEEDED, cls.FAILED}

    @classmethod
    def active(cls):
        return {cls.PENDING, cls.RUNNING}


OPERATION_STATUS_COLOURS = {
    OperationStatus.PENDING: "grey",
    OperationStatus.RUNNING: "blue",
    OperationStatus.SUCCEEDED: "green",
    OperationStatus.FAILED: "red",
}


class NodeState(models.TextChoices):
    """The console's view of a node's lifecycle; Slurm's own state is kept beside it."""

    PENDING = "PENDING", "Pending"
    PROVISIONING = "PROVISIONING", "Provisioning"
    READY = "READY", "Ready"
    FAILED = "FAILED", "Failed"
    DELETING = "DELETING", "Deleting"

    @classmethod
    def wanted(cls):
        """Nodes the cluster should have once its operation finishes."""
        return {cls.PENDING, cls.PROVISIONING, cls.READY, cls.FAILED}


NODE_STATE_COLOURS = {
    NodeState.PENDING: "grey",
    NodeState.PROVISIONING: "blue",
    NodeState.READY: "green",
    NodeState.FAILED: "red",
    NodeState.DELETING: "grey",
}


class NodeRole(models.TextChoices):
    LOGIN = "LOGIN", "Login"
    COMPUTE = "COMPUTE", "Compute"


class EventLevel(models.TextChoices):
    INFO = "INFO", "Info"
    WARNING = "WARNING", "Warning"
    ERROR = "ERROR", "Error"


EVENT_LEVEL_COLOURS = {EventLevel.INFO: "blue", EventLevel.WARNING: "amber", EventLevel.ERROR: "red"}


class Role(models.TextChoices):
    """A member's role in a project; each grants the permissions of the ones before it."""

    VIEWER = "viewer", "Viewer"  # reads everything in the project
    OPERATOR = "operator", "Operator"  # + runs, scans, jobs, slurmrestd calls
    ADMIN = "admin", "Admin"  # + create, resize, delete clusters; members; schedules

    @property
    def rank(self):
        return list(Role).index(self)

    @classmethod
    def at_least(cls, role):
        """The roles that include `role`'s permissions."""
        return [r for r in cls if r.rank >= cls(role).rank]
