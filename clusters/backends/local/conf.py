"""A local cluster's slurm.conf and HealthCheckProgram, and the shape each node is declared with."""

import hashlib
import os

from ...accounts import project_group
from ...choices import NodeRole
from ...slurm import hooks
from ...spec.catalog import machine_type_info
from ..base import NodeShape

MIN_CPUS = 2  # the tiny profiles' CPU ranks per node (recipes/catalog)


def machine_vcpus(pool):
    info = machine_type_info(pool.machine_type)
    return info.vcpus if info else 1


def machine_memory_mb(pool):
    info = machine_type_info(pool.machine_type)
    return info.memory_gb * 1024 if info else 1024


def host_memory_mb():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def node_shape(cluster, pool):
    """The pool's CPUs and memory scaled down, in proportion, to what this machine has.

    Every compute node of the cluster shares this host: CPUs are scaled so all nodes together
    declare about the host's cores, memory so they share half of its RAM. A node declares at least
    MIN_CPUS, so the tiny recipe profiles' ranks per node fit (slurmrestd 0.0.38 refuses the
    "overcommit" a job would need otherwise: "Disabled key"). GPUs are not emulated: a GPU pool's
    nodes run on CPU here.
    """
    pools = list(cluster.node_pools.filter(role=NodeRole.COMPUTE))
    wanted_cpus = sum(machine_vcpus(p) * p.node_count for p in pools) or 1
    wanted_mb = sum(machine_memory_mb(p) * p.node_count for p in pools) or 1
    cpu_factor = min(1.0, (os.cpu_count() or 1) / wanted_cpus)
    mem_factor = min(1.0, host_memory_mb() / 2 / wanted_mb)
    cpus = max(min(MIN_CPUS, machine_vcpus(pool)), int(machine_vcpus(pool) * cpu_factor))
    memory = max(256, int(machine_memory_mb(pool) * mem_factor))
    note = f"{cpus} of {machine_vcpus(pool)} vCPUs, {memory:,} of {machine_memory_mb(pool):,} MB"
    if pool.accelerator_count:
        note += f"; no GPUs here (spec: {pool.accelerator_count} x {pool.accelerator_type})"
    return NodeShape(cpus=cpus, memory_mb=memory, gpus=0, note=note)


def render(cluster, paths, wanted):
    ports = cluster.backend_state["ports"]
    lines = [
        "# Written by the console's local backend; edits are overwritten on the next update.",
        f"ClusterName=c{cluster.pk}{cluster.display_name}"[:40],
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports['slurmctld']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire=10: a requeued job may start again after ~11 s instead of ~121 s.
        f"AuthInfo=socket={paths.munge_socket},cred_expire=10",
        # slurmrestd clients authenticate with JWTs signed by this cluster's key.
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={paths.jwt_key}",
        f"StateSaveLocation={paths.state}",
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.root}/slurmctld.pid",
        f"SlurmdPidFile={paths.spool}/slurmd-%n.pid",
        f"SlurmctldLogFile={paths.logs}/slurmctld.log",
        f"SlurmdLogFile={paths.logs}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        # A scan asking for a FLEX reservation (holds) and using nodes outside it starts only in a
        # backfill pass: measured 10-17 s with the default bf_interval=30, under 1 s with 2.
        "SchedulerParameters=bf_interval=2",
        # Nodes are declared smaller than the machine; trust the declaration.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmdTimeout=10",
        "JobRequeue=1",
        # Every node is this host: no message fan-out through other slurmds.
        "TreeWidth=65533",
        "MailProg=/bin/true",
        f"HealthCheckProgram={paths.health_check}",
        "HealthCheckInterval=10",
        "HealthCheckNodeState=ANY",
    ]
    slurm = slurm_spec(cluster)
    lines += [f"{kind.capitalize()}={paths.hook(kind)}" for kind in hooks.KINDS if hooks.scripts(slurm, kind)]
    lines += hooks.scheduling_lines(slurm)
    lines.append("")
    by_pool, shapes = {}, {}
    for node in wanted:
        shape = shapes.setdefault(node.node_pool_id, node_shape(cluster, node.node_pool))
        lines.append(
            f"NodeName={node.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports['nodes'][node.name]} "
            f"CPUs={shape.cpus} RealMemory={shape.memory_mb} State=UNKNOWN"
        )
        by_pool.setdefault(node.node_pool_id, []).append(node.name)
    lines.append("")
    for partition in cluster.partitions.prefetch_related("node_pools"):
        names = [n for pool in partition.node_pools.all() for n in by_pool.get(pool.pk, [])]
        if not names:
            continue
        default = "YES" if partition.is_default else "NO"
        # Only the project's accounts (and root: the console's scans and repairs) submit here; every
        # project's accounts live on this machine (slurm.conf(5), AllowGroups).
        lines.append(
            f"PartitionName={partition.name} Nodes={','.join(names)} Default={default} MaxTime=INFINITE State=UP "
            f"AllowGroups={project_group(cluster.project)}"
        )
    return "\n".join(lines) + "\n"


def slurm_spec(cluster):
    return ((cluster.spec or {}).get("orchestrator_spec") or {}).get("slurm_spec") or {}


def replace(path, text, mode=None):
    """Write `text` to `path` (tmp + rename: never half a file) unless it already says exactly this."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def write_hooks(cluster, paths):
    """The spec's Prolog and Epilog with the console's preamble (clusters/slurm/hooks.py); every node
    of a local cluster is this machine, so one file each serves them all."""
    for kind in hooks.KINDS:
        text = hooks.render(slurm_spec(cluster), kind, shared=paths.jobs, environment={"SLURM_CONF": paths.conf})
        if text:
            replace(paths.hook(kind), text, 0o755)


def write(cluster, paths, wanted):
    """Write the Prolog and Epilog, then slurm.conf."""
    write_hooks(cluster, paths)
    replace(paths.conf, render(cluster, paths, wanted))


def digest(paths):
    return hashlib.sha256(paths.conf.read_bytes()).hexdigest()


def write_health_check(paths):
    """Slurm's HealthCheckProgram for every node: drains a node whose spool disk is nearly full.

    slurmd runs it as root with only SLURMD_NODENAME set, so it names every path in full.
    """
    faults = paths.faults
    script = f"""#!/bin/bash
# Written by the console's local backend: a light check slurmd runs every HealthCheckInterval.
export SLURM_CONF={paths.conf}
used=$(/usr/bin/df --output=pcent {paths.spool} | /usr/bin/tail -1 | /usr/bin/tr -dc 0-9)
if [ -f {faults}/$SLURMD_NODENAME.json ] && /usr/bin/grep -q disk_full {faults}/$SLURMD_NODENAME.json; then used=100; fi
if [ "${{used:-0}}" -ge 95 ]; then
  /usr/bin/scontrol update nodename=$SLURMD_NODENAME state=drain reason="tcc disk: spool $used% used"
fi
exit 0
"""
    path = paths.health_check
    if not path.exists() or path.read_text() != script:
        path.write_text(script)
        path.chmod(0o755)
