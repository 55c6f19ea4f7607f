"""Slurm training clusters: specs, provisioning backends, operations, pages and APIs."""
