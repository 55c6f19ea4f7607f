"""What the local backend needs from this machine (Slurm's programs and plugins, munge), checked up front.

A missing plugin otherwise shows up late and far away: slurmctld with `AuthAltTypes=auth/jwt` but no
`auth_jwt.so` logs `cannot find auth plugin for auth/jwt` and exits, and the create waits for a
controller that never answers. `scripts/bootstrap.sh` runs `main()` after installing packages, and a
local cluster's first step calls `problem()`.
"""

import glob
import os
import shutil
import sys

from ...processes import SEARCH_PATH

# program: the Debian package that ships it.
PROGRAMS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmrestd": "slurmrestd",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scontrol": "slurm-client",
    "sbatch": "slurm-client",
    "scancel": "slurm-client",
    "srun": "slurm-client",
    "setsid": "util-linux",
}
# Plugins the local backend's slurm.conf and slurmrestd command line name, and their packages.
PLUGINS = {
    "auth_munge.so": "slurm-wlm-basic-plugins",
    "cred_munge.so": "slurm-wlm-basic-plugins",
    "auth_jwt.so": "slurm-wlm-jwt-plugin",
    "proctrack_linuxproc.so": "slurm-wlm-basic-plugins",
    "select_cons_tres.so": "slurm-wlm-basic-plugins",
    "sched_backfill.so": "slurm-wlm-basic-plugins",
    "rest_auth_jwt.so": "slurm-wlm-basic-plugins",
    "openapi_v0_0_38.so": "slurm-wlm-basic-plugins",
}


def plugin_dirs():
    """Where Slurm looks for plugins: LOCAL_SLURM_PLUGIN_DIR if set, else Debian's and the usual places."""
    if os.environ.get("LOCAL_SLURM_PLUGIN_DIR"):
        return [os.environ["LOCAL_SLURM_PLUGIN_DIR"]]
    found = [*sorted(glob.glob("/usr/lib/*/slurm-wlm")), "/usr/lib/slurm-wlm", "/usr/lib64/slurm", "/usr/lib/slurm"]
    return [d for d in found if os.path.isdir(d)]


def missing():
    """{missing program or plugin: the Debian package that brings it}; empty when everything is there."""
    found = {name: package for name, package in PROGRAMS.items() if shutil.which(name, path=SEARCH_PATH) is None}
    dirs = plugin_dirs()
    for plugin, package in PLUGINS.items():
        if not any(os.path.exists(os.path.join(d, plugin)) for d in dirs):
            found[f"Slurm plugin {plugin}"] = package
    return found


def problem():
    """One sentence saying what is missing and what to install, or "" when nothing is."""
    found = missing()
    if not found:
        return ""
    dirs = plugin_dirs()
    where = f"plugins looked for in {', '.join(dirs)}" if dirs else "no Slurm plugin folder on this machine"
    packages = " ".join(sorted(set(found.values())))
    return f"the local backend cannot run Slurm here: {', '.join(found)} missing ({where}); apt-get install {packages}"


def main():
    line = problem()
    if line:
        print(line, file=sys.stderr)
    return 1 if line else 0
