"""The `gce` backend: Compute Engine VMs running Slurm (see backend.py)."""

from .backend import GceBackend

__all__ = ["GceBackend"]
