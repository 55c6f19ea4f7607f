"""The Prolog and Epilog scripts every backend gives slurmd: the spec's `prolog_bash_scripts` and
`epilog_bash_scripts`, in order, after a preamble of the console's own.

slurmd runs them as root on each compute node with almost no environment, so the preamble sets PATH
(and, where the backend needs it, SLURM_CONF) and defines `tcc_gpu_check`: the console's fast GPU
checks after a job (clusters/health/epilog.py; GPU inventory, ECC and Xids in a second or two), which
drain a failing node with the reason "tcc CHECK: ..." that the console repairs, and never fail the
epilog themselves (Slurm drains a node whose epilog fails, with no reason worth reading). The
reference architectures' GPU pools call it in their epilog. Its script lives in the cluster's shared
home (GPU_CHECK, written by each health scan with the runtime it runs), so a new console version's
checks reach the nodes without touching slurm.conf; before the cluster's first scan it does nothing.

Compute nodes in configless mode do not receive these files with slurm.conf (Slurm 22.05): each
backend writes them on every node itself (local: its cluster folder; gce: each node's startup script
from its metadata).
"""

import shlex

GPU_CHECK = ".tcc/health/gpu-check.sh"  # below the cluster's shared home
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KINDS = ("prolog", "epilog")


def scripts(slurm_spec, kind):
    return [s for s in (slurm_spec or {}).get(f"{kind}_bash_scripts") or [] if s.strip()]


def render(slurm_spec, kind, *, shared, environment=None):
    """The whole script for `kind` ("prolog" or "epilog"), or "" when the spec has none."""
    found = scripts(slurm_spec, kind)
    if not found:
        return ""
    check = f"{shared}/{GPU_CHECK}"
    exports = {"PATH": PATH, **(environment or {})}
    lines = [
        "#!/bin/bash",
        f"# Slurm {kind.capitalize()}, written by the console: its preamble, then the spec's {kind}_bash_scripts.",
        "export " + " ".join(f"{name}={shlex.quote(str(value))}" for name, value in exports.items()),
        "tcc_gpu_check() {  # the console's fast GPU checks; drains a failing node with its reason",
        f"  [ -f {shlex.quote(check)} ] || return 0  # the cluster's first health scan installs it",
        f"  bash {shlex.quote(check)} || true",
        "}",
        "",
    ]
    return "\n".join(lines) + "\n\n".join(found) + "\n"


SCHEDULING = {
    "priority_type": "PriorityType",
    "preempt_type": "PreemptType",
    "preempt_mode": "PreemptMode",
    "preempt_exempt_time": "PreemptExemptTime",
    "priority_weight_age": "PriorityWeightAge",
    "priority_weight_assoc": "PriorityWeightAssoc",
    "priority_weight_fairshare": "PriorityWeightFairshare",
    "priority_weight_job_size": "PriorityWeightJobSize",
    "priority_weight_partition": "PriorityWeightPartition",
    "priority_weight_qos": "PriorityWeightQOS",
    "priority_weight_tres": "PriorityWeightTRES",
}


def scheduling_lines(slurm_spec):
    """slurm.conf lines for the spec's `scheduling` block (validated by clusters/spec/validator.py)."""
    scheduling = (slurm_spec or {}).get("scheduling") or {}
    return [f"{conf}={scheduling[key]}" for key, conf in SCHEDULING.items() if key in scheduling]
