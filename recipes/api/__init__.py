"""The recipes part of /api/v1: the catalog, runs and model versions (its own URLs: urls.py)."""
