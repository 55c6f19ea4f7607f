"""Ports for a local cluster's daemons: free ones from LOCAL_PORT_RANGE, kept in backend_state."""

import random
import socket

from django.conf import settings

from ...choices import ClusterStatus
from ...work import TransientBackendError
from ..base import Backend


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def port_answers(port):
    """Something accepts connections on 127.0.0.1:port (a daemon is serving, not only bound)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def assign(cluster, wanted):
    """Give slurmctld, slurmrestd, the cluster agent and every wanted node a port; a node keeps the one it has."""
    ports = dict(cluster.backend_state.get("ports", {}))
    nodes = {n: p for n, p in ports.get("nodes", {}).items() if n in {w.name for w in wanted}}
    taken = in_use() | set(nodes.values())
    for daemon in ("slurmctld", "slurmrestd", "agent"):
        if daemon not in ports:
            ports[daemon] = pick(taken)
        taken.add(ports[daemon])
    for node in wanted:
        if node.name not in nodes:
            nodes[node.name] = pick(taken)
            taken.add(nodes[node.name])
    ports["nodes"] = nodes
    Backend.save_state(cluster, ports=ports)


def in_use():
    """Every port a live local cluster has been given."""
    # Imported here: bootstrap.sh runs the local preflight (which imports this module) before Django
    # is set up, and models cannot be imported then.
    from ...models import Cluster

    used = set()
    for state in (
        Cluster.objects.filter(backend="local")
        .exclude(status=ClusterStatus.DELETED)
        .values_list("backend_state", flat=True)
    ):
        ports = (state or {}).get("ports", {})
        used.update([ports.get(d) for d in ("slurmctld", "slurmrestd", "agent")] + [*ports.get("nodes", {}).values()])
    return used


def pick(taken):
    low, high = settings.LOCAL_PORT_RANGE
    for _ in range(200):
        port = random.randint(low, high)
        if port not in taken and port_is_free(port):
            return port
    raise TransientBackendError(f"no free port found between {low} and {high}")
