"""A TensorBoard per cluster over its runs folder, started on demand by the cluster agent, on a Unix socket
on the controller that only the agent reaches, and reached by users only through the console's login (the
view in recipes/runs/views.py relays to it through the agent, keeping the path prefix)."""

import contextlib

from clusters import services
from console.errors import ConsoleError


def prefix(cluster):
    return f"/clusters/{cluster.project.slug}/{cluster.name}/tensorboard"


def request(cluster, method, path, body=None, content_type=""):
    """(status, headers, body) of the cluster's TensorBoard (started if need be); ConsoleError when the
    agent cannot reach or start it."""
    return services.tensorboard_request(cluster, prefix(cluster), method, path, body, content_type)


def stop(cluster):
    """Stop it; a cluster whose agent is gone (deleted) has no TensorBoard left to stop."""
    with contextlib.suppress(ConsoleError):
        services.stop_tensorboard(cluster)
