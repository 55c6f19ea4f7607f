"""The spec's Prolog, Epilog and scheduling reach Slurm on both backends (clusters/slurm/hooks.py):
alice's spec asks for an epilog and priority settings; the scripts are run here as slurmd runs them
(bash, as root, with an empty environment). The job-level behaviour (a GPU fault drains the node after
a job, a healthy node stays idle) runs on real clusters in test_health.py."""

import subprocess

import pytest

from clusters.backends.local import conf
from clusters.backends.local.paths import ClusterPaths
from clusters.services import create_cluster
from clusters.slurm import hooks

from .conftest import scripted_spec

pytestmark = pytest.mark.django_db
SLURM = {
    "epilog_bash_scripts": ["echo first >> order.txt", "# the reference architectures' GPU pools\ntcc_gpu_check"],
    "prolog_bash_scripts": ["  "],
    "scheduling": {"priority_type": "priority/multifactor", "priority_weight_age": 1000},
}


def run_as_slurmd(script, tmp_path):
    path = tmp_path / "hook.sh"
    path.write_text(script)
    return subprocess.run(["env", "-i", "bash", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_the_epilog_runs_the_specs_scripts_in_order_after_the_preamble_and_the_check_is_quiet_until_installed(
    tmp_path,
):
    script = hooks.render(SLURM, "epilog", shared=tmp_path / "home", environment={"SLURM_CONF": "/x/slurm.conf"})
    assert script.startswith("#!/bin/bash\n") and "export PATH=" in script and "SLURM_CONF=/x/slurm.conf" in script
    assert hooks.render(SLURM, "prolog", shared=tmp_path) == ""  # blank scripts are no scripts
    done = run_as_slurmd(script, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")  # no GPU check installed yet: nothing, and no failure
    assert (tmp_path / "order.txt").read_text() == "first\n"
    check = tmp_path / "home" / hooks.GPU_CHECK
    check.parent.mkdir(parents=True)
    check.write_text('echo "checked with PATH=$PATH" > checked.txt\nexit 3\n')  # a failing check fails nothing
    assert run_as_slurmd(script, tmp_path).returncode == 0
    assert (tmp_path / "checked.txt").read_text() == f"checked with PATH={hooks.PATH}\n"


def test_the_local_backend_writes_the_hooks_and_the_scheduling_into_slurm_conf(alpha, alice, scripted, tmp_path):
    spec = scripted_spec()
    spec["orchestrator_spec"]["slurm_spec"].update(SLURM)
    cluster = create_cluster(project=alpha, name="demo", spec=spec, user=alice).cluster
    wanted = list(cluster.compute_nodes())
    cluster.backend_state = {"ports": {"slurmctld": 20001, "nodes": {n.name: 20002 + i for i, n in enumerate(wanted)}}}
    paths = ClusterPaths(tmp_path)
    conf.write(cluster, paths, wanted)
    text = paths.conf.read_text()
    assert f"Epilog={tmp_path}/epilog.sh" in text and "Prolog=" not in text
    assert "PriorityType=priority/multifactor" in text and "PriorityWeightAge=1000" in text
    epilog = paths.hook("epilog")
    assert epilog.stat().st_mode & 0o777 == 0o755
    assert f"SLURM_CONF={paths.conf}" in epilog.read_text() and epilog.read_text().endswith("tcc_gpu_check\n")
    assert not paths.hook("prolog").exists()
