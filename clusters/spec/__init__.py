"""Cluster specs: the managed service's cluster JSON, validated in one place."""

from .validator import SpecError, normalize, pool_node_count, validate_spec

__all__ = ["SpecError", "normalize", "pool_node_count", "validate_spec"]
