"""Slurm on a gce cluster's VMs: slurm.conf rendered from the spec, the startup script, and the
metadata the controller and login nodes read (slurm.conf, gres.conf, prolog, epilog, the agent)."""

from pathlib import Path

from django.conf import settings

from ...choices import NodeRole
from ...slurm import hooks, hostlist
from ...spec import pool_node_count
from ...spec.catalog import machine_fabric, machine_type_info, nccl_networks
from ...work import TransientBackendError
from . import storage as storage_mod
from .errors import map_api_error
from .names import gpu_count, is_gpu_pool

# google.cloud and google.api_core are imported inside the functions that call them (start-up cost: about
# 1.4 s on this machine, paid only by the workers that act on gce clusters).

# Where slurmctld finds the JWT key the startup script reads from Secret Manager (Slurm's docs keep it
# beside the state); the console signs slurmrestd's tokens with the same key (keys.py).
JWT_KEY = "/var/spool/slurmctld/jwt_hs256.key"
# The folder under the shared /home that the console's runs, scans and the cluster agent work in.
SHARED = "/home/tcc"
AGENT = Path(__file__).resolve().parents[2] / "agent" / "server.py"
# Where a configless slurmd keeps the slurm.conf it fetched (scontrol on a compute node reads it).
CONFIGLESS_CONF = "/var/spool/slurmd/conf-cache/slurm.conf"


# cgroup v2 confinement of every job: its cores, its memory and its devices (a job given 2 GPUs sees
# those 2, not the node's 8). Configless slurmds fetch cgroup.conf from the controller with slurm.conf.
# https://slurm.schedmd.com/cgroup.conf.html, https://slurm.schedmd.com/gres.html (ConstrainDevices)
CGROUP_CONF = """# Written by the console's gce backend.
CgroupPlugin=cgroup/v2
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
"""


def slurm_items(cloud):
    """Metadata the controller and login nodes read: slurm.conf, gres.conf, cgroup.conf and the Prolog and
    Epilog."""
    from google.cloud import compute_v1

    return [
        compute_v1.Items(key="slurm-conf", value=render(cloud)),
        compute_v1.Items(key="slurm-gres-conf", value=render_gres(cloud)),
        compute_v1.Items(key="slurm-cgroup-conf", value=CGROUP_CONF),
        *hook_items(cloud),
    ]


def hook_items(cloud):
    """The Prolog and Epilog (clusters/slurm/hooks.py) as metadata: the compute nodes' startup script
    writes them to /etc/slurm (configless slurmds are not sent them), the controller's too."""
    from google.cloud import compute_v1

    slurm = cloud.spec["orchestrator_spec"]["slurm_spec"]
    environment = {"SLURM_CONF": CONFIGLESS_CONF}
    return [
        compute_v1.Items(key=f"slurm-{kind}", value=hooks.render(slurm, kind, shared=SHARED, environment=environment))
        for kind in hooks.KINDS
    ]


def head_names(cloud):
    login_id = cloud.login_pool["id"]
    return [
        cloud.n.controller,
        *(cloud.n.instance(f"{login_id}-{i}") for i in range(pool_node_count(cloud.login_pool))),
    ]


def agent_item(cloud):
    """The cluster agent's code for the controller (it reads it at boot): standard library only."""
    from google.cloud import compute_v1

    return compute_v1.Items(key="tcc-agent", value=AGENT.read_text())


def update_slurm_conf(cloud):
    """After a resize, give the controller and login nodes the new node list: their watchers see the
    change (metadata wait_for_change), and the controller's restarts slurmctld with it."""
    wanted = {item.key: item.value for item in slurm_items(cloud)}
    for name in head_names(cloud):
        change_metadata(cloud, name, lambda items: {**items, **wanted}, f"updating slurm.conf on {name}")


def change_metadata(cloud, name, change, what):
    """Apply `change(items) -> items` to an instance's metadata with Compute's fingerprint check,
    reading again when a concurrent change moved it. False when the instance does not exist."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    for _ in range(3):
        instance = cloud.get(lambda: cloud.c.instances.get(project=cloud.project, zone=cloud.zone, instance=name))
        if instance is None:
            return False
        items = {item.key: item.value for item in instance.metadata.items}
        wanted = change(items)
        if wanted == items:
            return True
        metadata = compute_v1.Metadata(
            fingerprint=instance.metadata.fingerprint,
            items=[compute_v1.Items(key=k, value=v) for k, v in wanted.items()],
        )
        try:
            operation = cloud.c.instances.set_metadata_unary(
                project=cloud.project, zone=cloud.zone, instance=name, metadata_resource=metadata
            )
        except exceptions.PreconditionFailed:
            continue
        except exceptions.GoogleAPICallError as exc:
            raise map_api_error(exc, what) from None
        cloud.wait(operation, what)
        return True
    raise TransientBackendError(f"{what}: the instance's metadata kept changing; will retry")


def render(cloud):
    """slurm.conf for the VMs: configless slurmd, one NodeName line per pool, the spec's scheduling."""
    slurm = cloud.spec["orchestrator_spec"]["slurm_spec"]
    lines = [
        "# Written by the console's gce backend; the controller's agent reloads it when it changes.",
        f"ClusterName={cloud.n.prefix.replace('-', '')[:40]}",
        f"SlurmctldHost={cloud.n.controller}",
        "SlurmctldParameters=enable_configless",
        "AuthType=auth/munge",
        # Slurm's default is 120 s, which is also how long a requeued job waits before it may start again.
        f"AuthInfo=cred_expire={settings.GCE_SLURM_CRED_EXPIRE}",
        # slurmrestd's clients (the console) authenticate with JWTs signed with the cluster's key.
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={JWT_KEY}",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "ReturnToService=2",
        "JobRequeue=1",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        # Each compute node's startup script writes this light check (spool disk), run by slurmd.
        "HealthCheckProgram=/etc/slurm/healthcheck.sh",
        f"HealthCheckInterval={settings.GCE_HEALTH_CHECK_INTERVAL}",
        "HealthCheckNodeState=ANY",
    ]
    # Always: each node's Prolog takes the console's new accounts before the spec's prolog (startup.sh).
    lines.append("Prolog=/etc/slurm/prolog.sh")
    if slurm.get("epilog_bash_scripts"):
        lines.append("Epilog=/etc/slurm/epilog.sh")
    enforce = (slurm.get("accounting") or {}).get("accounting_storage_enforce")
    if enforce:
        lines.append(f"AccountingStorageEnforce={enforce}")
    lines += hooks.scheduling_lines(slurm)
    lines.append("")
    wanted = {}
    for node in cloud.cluster.wanted_nodes().select_related("node_pool"):
        if node.node_pool.role == NodeRole.COMPUTE:
            wanted.setdefault(node.node_pool.pool_id, []).append(node.name)
    for pool in cloud.compute_pools:
        info = machine_type_info(pool["machine_spec"]["machine_type"])
        gpus = gpu_count(pool)
        nodes = wanted.get(pool["id"], [])
        if not nodes:
            continue
        # One line per pool, in hostlist expressions (NodeHostname with as many entries as NodeName):
        # a 10,000-node pool is one line, and slurm.conf stays within Compute's 256 KB metadata value.
        memory = int(info.memory_gb * 1024 * 0.9)  # leave the OS a tenth
        hosts = hostlist.compress(cloud.n.instance(n) for n in nodes)
        line = f"NodeName={hostlist.compress(nodes)} NodeHostname={hosts} CPUs={info.vcpus} RealMemory={memory}"
        lines.append(line + (f" Gres=gpu:{gpus}" if gpus else "") + " State=UNKNOWN")
    lines.append("")
    for i, partition in enumerate(slurm["partitions"]):
        nodes = [n for pool_id in partition["node_pool_ids"] for n in wanted.get(pool_id, [])]
        if nodes:
            gpu = any(is_gpu_pool(p) for p in cloud.compute_pools if p["id"] in partition["node_pool_ids"])
            lines.append(
                f"PartitionName={partition['id']} Nodes={hostlist.compress(nodes)} Default={'YES' if i == 0 else 'NO'} "
                f"MaxTime=INFINITE State=UP{' OverSubscribe=EXCLUSIVE' if gpu else ''}"
            )
    return "\n".join(lines) + "\n"


STARTUP = Path(__file__).resolve().parent / "startup.sh"


def render_gres(cloud):
    """gres.conf for the GPU nodes (configless slurmds get it from the controller with slurm.conf):
    one line per GPU pool naming its nodes' /dev/nvidia devices, so `sinfo` shows gpu:8."""
    wanted = {}
    for node in cloud.cluster.wanted_nodes().select_related("node_pool"):
        if node.node_pool.role == NodeRole.COMPUTE:
            wanted.setdefault(node.node_pool.pool_id, []).append(node.name)
    lines = ["# Written by the console's gce backend."]
    for pool in cloud.compute_pools:
        gpus = gpu_count(pool)
        nodes = sorted(wanted.get(pool["id"], []), key=lambda n: int(n.rsplit("-", 1)[1]))
        if gpus and nodes:
            devices = "/dev/nvidia0" if gpus == 1 else f"/dev/nvidia[0-{gpus - 1}]"
            lines.append(f"NodeName={hostlist.compress(nodes)} Name=gpu File={devices}")
    return "\n".join(lines) + "\n"


# Mount options gcsfuse takes with -o (FUSE's own); everything else is one of gcsfuse's flags.
FUSE_OPTIONS = ("allow_other", "ro", "rw", "uid=", "gid=", "file_mode=", "dir_mode=")


def gcsfuse_flags(options):
    """The spec's mount options as gcsfuse's command line: a config key written `section:key:value`
    (the form GKE's Cloud Storage FUSE driver takes) is the flag `--section-key=value`, a bare name
    `--name`, FUSE options go to -o, and allow_other always does, so users' jobs (not root) read the
    mount. https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options"""
    flags, fuse = [], ["allow_other"]
    for option in options:
        if option.startswith(FUSE_OPTIONS):
            fuse.append(option)
        elif ":" in option:
            *keys, value = option.split(":")
            flags.append(f"--{'-'.join(keys)}={value}")
        else:
            flags.append(f"--{option}")
    return " ".join([*flags, "-o", ",".join(dict.fromkeys(fuse))])


def startup_script(cloud, pool, role):
    """The node's startup script: install Slurm, join the controller, mount /home, Lustre and buckets."""
    storage = cloud.storage
    mounts = [
        f"{b['bucket']} {b['mount_point']} {gcsfuse_flags(b.get('mount_options', []))}"
        for b in storage.get("gcs_buckets", [])
    ]
    state = cloud.cluster.backend_state or {}
    gpus = gpu_count(pool) if role == "compute" else 0
    values = {
        "ROLE": role,
        "CLUSTER": cloud.n.prefix,
        "CONTROLLER": cloud.n.controller,
        # Filled in by the storage steps, which run before any instance is defined.
        "HOME_SHARE": state.get("home_share", "") if storage.get("filestore_home") else "",
        "LUSTRE": state.get("lustre_mount_point", "") if storage.get("lustre") else "",
        "LUSTRE_MOUNT": (storage.get("lustre") or {}).get("mount_point", "/lustre"),
        "GCS_MOUNTS": ";".join(mounts),
        "EXISTING_MOUNTS": ";".join(storage_mod.existing_mounts(cloud, pool)),
        "GPUS": str(gpus),
        "FABRIC": machine_fabric(pool["machine_spec"]["machine_type"]) if gpus else "",
        "TCPXO_DAEMON": nccl_networks()["tcpxo"]["daemon"],
        "SECRETS": settings.GCE_SECRET_MANAGER_ENDPOINT or "https://secretmanager.googleapis.com",
        "SHARED": SHARED,
        "SLURMRESTD_PORT": str(settings.GCE_SLURMRESTD_PORT),
        "AGENT_PORT": str(settings.GCE_AGENT_PORT),
        "NODE_PYTHON": settings.GCE_NODE_PYTHON,
        "ACCOUNT_PREFIX": settings.POSIX_ACCOUNT_PREFIX,
        "USER_SCRIPT": pool.get("startup_script", ""),
    }
    unknown = [
        what
        for what, block, value in (
            ("the Filestore address", "filestore_home", values["HOME_SHARE"]),
            ("the Lustre mount point", "lustre", values["LUSTRE"]),
        )
        if storage.get(block) and not value
    ]
    if unknown:
        raise TransientBackendError(f"{' and '.join(unknown)} is not known yet (the storage steps read it)")
    text = STARTUP.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value.replace("'", "'\\''"))
    return text
