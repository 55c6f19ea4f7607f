"""Slurm as the console sees it: one vocabulary of node and job states (states.py), the records every
backend reports (NodeStatus, JobStatus) and the parsers and client helpers the backends share."""
