"""The registry of cluster backends, keyed by the name a spec's console.backend gives."""

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from .base import Backend, BackendError, PermanentBackendError, TransientBackendError

__all__ = [
    "Backend",
    "BackendError",
    "PermanentBackendError",
    "TransientBackendError",
    "all_backends",
    "forget",
    "get_backend",
]


@cache
def _load(path):
    return import_string(path)()


def forget():
    """Drop the loaded backend instances, so the next lookup makes fresh ones (tests swap backends)."""
    _load.cache_clear()


def all_backends():
    """{name: backend}, the default backend first."""
    names = sorted(settings.CLUSTER_BACKENDS, key=lambda n: n != settings.DEFAULT_CLUSTER_BACKEND)
    return {name: _load(settings.CLUSTER_BACKENDS[name]) for name in names}


def get_backend(name):
    try:
        return _load(settings.CLUSTER_BACKENDS[name])
    except KeyError:
        raise PermanentBackendError(f"No backend named '{name}' is configured") from None
