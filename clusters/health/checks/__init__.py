"""The built-in checks; each module registers itself with clusters.health.check()."""
