"""Inference endpoints: requests (endpoints.py), replicas as Slurm jobs (replicas.py), autoscaling
(autoscale.py), the periodic reconcile (reconcile.py) and the router process (router.py)."""

from .autoscale import autoscale
from .endpoints import change_endpoint, check, create_endpoint, delete_endpoint, live_endpoint, series, traffic
from .reconcile import due, reconcile, reconcile_one
from .replicas import replica_script

__all__ = [
    "autoscale",
    "change_endpoint",
    "check",
    "create_endpoint",
    "delete_endpoint",
    "due",
    "live_endpoint",
    "reconcile",
    "reconcile_one",
    "replica_script",
    "series",
    "traffic",
]
