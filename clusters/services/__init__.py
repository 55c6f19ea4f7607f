"""Service functions: the one door pages, APIs, recipes and health use to ask anything of a cluster.

requests.py   create (and dry run), drafts, update, delete: validate, then operations.start
reach.py      what a page or recipe needs from the cluster's backend (shapes, plan, jobs, slurmrestd)
sync.py       the periodic sync: Slurm's node states and job queue pulled into the database
live.py       those rows, read (pages and GET endpoints read only these, never Slurm)
files.py      the cluster's files under its shared home, through the cluster agent
runtime.py    the console's code the nodes run (health agent, recipes/node/train.py), installed in the home
members.py    a project's members and roles
certificates.py  the controller's TLS certificate: its end, its rotation (ROTATE_TLS)
"""

from . import certificates, members
from .files import (
    download_folder,
    file_exists,
    file_sizes,
    list_files,
    prune_files,
    read_file,
    stop_tensorboard,
    tail_file,
    tensorboard_request,
    upload_folder,
    upload_parts,
    write_file,
)
from .live import job_filters, jobs_of, node_state_counts, nodes_of, sync_state, with_latest_operations
from .reach import (
    backend_choices,
    backend_label,
    call_slurm_rest,
    cancel_job,
    drain,
    endpoints_refused,
    fault_backend,
    gpus_per_node,
    inject_fault,
    job_address,
    job_node,
    job_status,
    jobs_named,
    login_command,
    login_env,
    node_shapes,
    plan,
    shared_dir,
    submit_batch,
)
from .requests import (
    bake_node_image,
    create_cluster,
    create_draft,
    delete_cluster,
    dry_run,
    preflight,
    save_draft,
    submit_draft,
    update_cluster,
    validate_request,
)
from .runtime import node_runtime
from .sync import on_sync, sync_cluster

__all__ = [
    "backend_choices",
    "backend_label",
    "bake_node_image",
    "call_slurm_rest",
    "cancel_job",
    "certificates",
    "create_cluster",
    "create_draft",
    "delete_cluster",
    "download_folder",
    "drain",
    "dry_run",
    "endpoints_refused",
    "fault_backend",
    "file_exists",
    "file_sizes",
    "gpus_per_node",
    "inject_fault",
    "job_address",
    "job_filters",
    "job_node",
    "job_status",
    "jobs_named",
    "jobs_of",
    "list_files",
    "login_command",
    "login_env",
    "members",
    "node_runtime",
    "node_shapes",
    "node_state_counts",
    "nodes_of",
    "on_sync",
    "plan",
    "preflight",
    "prune_files",
    "read_file",
    "save_draft",
    "shared_dir",
    "stop_tensorboard",
    "submit_batch",
    "submit_draft",
    "sync_cluster",
    "sync_state",
    "tail_file",
    "tensorboard_request",
    "update_cluster",
    "upload_folder",
    "upload_parts",
    "validate_request",
    "with_latest_operations",
    "write_file",
]
