"""The `local` backend: a real Slurm cluster on this machine (see backend.py)."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
