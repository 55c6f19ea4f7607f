"""A TensorBoard per cluster over its runs folder, started on demand by the cluster agent, bound to
127.0.0.1 on the controller and reached only through the console's login (the view in
recipes/views.py proxies to it, keeping the path prefix)."""

import contextlib

from clusters import services
from console.errors import ConsoleError


def prefix(cluster):
    return f"/clusters/{cluster.project.slug}/{cluster.name}/tensorboard"


def ensure(cluster):
    """(host, port) of the cluster's TensorBoard once it answers; ConsoleError when it cannot start."""
    return services.tensorboard(cluster, prefix(cluster))


def stop(cluster):
    """Stop it; a cluster whose agent is gone (deleted) has no TensorBoard left to stop."""
    with contextlib.suppress(ConsoleError):
        services.stop_tensorboard(cluster)
