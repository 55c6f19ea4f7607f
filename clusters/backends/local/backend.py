"""The `local` backend: a real Slurm cluster on this machine, one directory per cluster.

Each cluster gets its own munged (own key and socket), its own slurmctld and one `slurmd -N <node>`
per compute node, all on their own ports, with slurm.conf, state, spool and logs under
LOCAL_CLUSTERS_DIR/c<cluster id>. The login node is this machine itself: `SLURM_CONF=<dir>/slurm.conf`
makes sinfo, sbatch and squeue talk to the cluster.
"""

import contextlib
import hashlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from ...choices import ClusterStatus, NodeRole, NodeState
from ...spec import pool_node_count
from ...spec.catalog import machine_type_info
from .. import processes
from ..base import Backend, NodeShape, PermanentBackendError, Step, TransientBackendError
from ..slurm import parse_sinfo, parse_squeue, run_client
from . import preflight


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @property
    def conf(self):
        return self.root / "slurm.conf"

    @property
    def secrets(self):
        return self.root / "secrets"

    @property
    def munge_key(self):
        return self.secrets / "munge.key"

    @property
    def jwt_key(self):
        return self.secrets / "jwt_hs256.key"

    @property
    def munge_dir(self):
        return self.root / "munge"

    @property
    def munge_socket(self):
        return self.munge_dir / "munge.socket"

    @property
    def state(self):
        return self.root / "state"

    @property
    def spool(self):
        return self.root / "spool"

    @property
    def logs(self):
        return self.root / "log"

    @property
    def jobs(self):
        """Where job output goes by default: the cluster's shared 'home'."""
        return self.root / "home"


def machine_vcpus(pool):
    info = machine_type_info(pool.machine_type)
    return info.vcpus if info else 1


def machine_memory_mb(pool):
    info = machine_type_info(pool.machine_type)
    return info.memory_gb * 1024 if info else 1024


def host_memory_mb():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def write_secret(path, size):
    """A random key file, readable by root alone, written once (tmp + rename, so never half a key)."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secrets.token_bytes(size))
    os.replace(tmp, path)


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


class LocalBackend(Backend):
    name = "local"
    label = "Local Slurm on this machine"
    runs_jobs = True

    # -- contract -----------------------------------------------------------------------------

    def validate_spec(self, spec):
        login = spec["orchestrator_spec"]["slurm_spec"].get("login_node_pool_id")
        total = sum(pool_node_count(p) for p in spec["node_pools"] if p.get("id") != login)
        if total > settings.LOCAL_MAX_NODES:
            yield (
                "node_pools",
                f"the local backend runs at most {settings.LOCAL_MAX_NODES} compute nodes on this machine; "
                f"this spec asks for {total} (use the gce backend for more)",
            )

    def node_shape(self, cluster, pool):
        """The pool's CPUs and memory scaled down, in proportion, to what this machine has.

        Every compute node of the cluster shares this host: CPUs are scaled so all nodes together
        declare about the host's cores (at least 1 each), memory so they share half of its RAM.
        GPUs are not emulated: a GPU pool's nodes run on CPU here.
        """
        pools = list(cluster.node_pools.filter(role=NodeRole.COMPUTE))
        wanted_cpus = sum(machine_vcpus(p) * p.node_count for p in pools) or 1
        wanted_mb = sum(machine_memory_mb(p) * p.node_count for p in pools) or 1
        cpu_factor = min(1.0, (os.cpu_count() or 1) / wanted_cpus)
        mem_factor = min(1.0, host_memory_mb() / 2 / wanted_mb)
        cpus = max(1, int(machine_vcpus(pool) * cpu_factor))
        memory = max(256, int(machine_memory_mb(pool) * mem_factor))
        note = f"{cpus} of {machine_vcpus(pool)} vCPUs, {memory:,} of {machine_memory_mb(pool):,} MB"
        if pool.accelerator_count:
            note += f"; no GPUs here (spec: {pool.accelerator_count} x {pool.accelerator_type})"
        return NodeShape(cpus=cpus, memory_mb=memory, gpus=0, note=note)

    def plan(self, project, cluster_name, spec):
        login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
        items = [
            ("Cluster directory", f"{settings.LOCAL_CLUSTERS_DIR}/c<id>", "slurm.conf, state, spool, logs, /home"),
            ("munged", "munge/munge.socket", "its own key (secrets/munge.key, 0400)"),
            ("slurmctld", "slurmctld", "its own port from LOCAL_PORT_RANGE"),
        ]
        for pool in spec["node_pools"]:
            if pool["id"] == login:
                items.append(("Login node", "this machine", "SLURM_CONF=<cluster directory>/slurm.conf"))
                continue
            for i in range(pool_node_count(pool)):
                items.append(
                    ("slurmd", f"{pool['id']}-{i}", f"{pool['machine_spec']['machine_type']} scaled to this machine")
                )
        for partition in spec["orchestrator_spec"]["slurm_spec"]["partitions"]:
            items.append(("Slurm partition", partition["id"], ", ".join(partition["node_pool_ids"])))
        return items

    def apply_steps(self, cluster, hold=None):
        paths = self.paths(cluster)
        wanted = list(cluster.compute_nodes().select_related("node_pool"))
        new = [n.name for n in wanted if n.state == NodeState.PROVISIONING]
        leaving = list(cluster.nodes.filter(state=NodeState.DELETING))
        steps = [
            Step("Prepare the cluster directory and munge key", lambda: self.prepare(paths)),
            Step("Start munged", lambda: self.start_munged(paths)),
            Step("Assign ports", lambda: self.assign_ports(cluster, wanted)),
        ]
        steps += [Step(f"Stop slurmd on {n.name}", lambda n=n: self.stop_slurmd(paths, n.name)) for n in leaving]
        steps += [
            Step("Write slurm.conf", lambda: self.write_conf(cluster, paths, wanted)),
            Step("Start slurmctld", lambda: self.start_slurmctld(cluster, paths)),
        ]
        if hold and new:
            # Before their slurmd starts: no user job can land on a node between registering and its scan.
            steps.append(Step("Hold the new nodes for their first health scan", lambda: self.hold(cluster, hold, new)))
        steps += [
            Step(f"Start slurmd on {n.name}", lambda n=n: self.start_slurmd(cluster, paths, n.name)) for n in wanted
        ]
        steps += [
            Step("Reconfigure running nodes", lambda: self.reconfigure(cluster, paths, [n.name for n in wanted])),
            Step("Wait for nodes to register idle", lambda: self.wait_idle(paths, [n.name for n in wanted])),
            Step("Start slurmrestd", lambda: self.start_slurmrestd(cluster, paths)),
        ]
        return steps

    def delete_steps(self, cluster):
        paths = self.paths(cluster)
        return [
            Step("Stop slurmrestd", lambda: processes.stop(processes.find_pids("slurmrestd", str(paths.conf)))),
            Step("Stop slurmd on every node", lambda: processes.stop(processes.find_pids("slurmd", str(paths.conf)))),
            Step("Stop slurmctld", lambda: processes.stop(processes.find_pids("slurmctld", str(paths.conf)))),
            Step("Stop munged", lambda: processes.stop(processes.find_pids("munged", str(paths.munge_socket)))),
            Step("Remove the cluster directory", lambda: shutil.rmtree(paths.root, ignore_errors=True)),
        ]

    def node_statuses(self, cluster):
        paths = self.paths(cluster)
        if not paths.conf.exists():
            return []
        return parse_sinfo(run_client(paths.conf, "sinfo", "--json", timeout=10).stdout)

    def jobs(self, cluster):
        paths = self.paths(cluster)
        if not paths.conf.exists():
            return []
        return parse_squeue(run_client(paths.conf, "squeue", "--json", timeout=10).stdout)

    def shared_dir(self, cluster):
        return self.paths(cluster).jobs

    def submit_batch(self, cluster, script_path):
        paths = self.paths(cluster)
        result = run_client(paths.conf, "sbatch", "--parsable", str(script_path), timeout=30, cwd=paths.jobs)
        return int(result.stdout.strip().split(";")[0])

    def cancel_job(self, cluster, job_id):
        run_client(self.paths(cluster).conf, "scancel", str(job_id), timeout=30)

    def job_status(self, cluster, job_id):
        result = run_client(self.paths(cluster).conf, "squeue", "--json", "-j", str(job_id), timeout=15, check=False)
        if result.returncode != 0:
            return None  # Slurm has forgotten the job (older than MinJobAge)
        return next((job for job in parse_squeue(result.stdout) if job.job_id == job_id), None)

    # -- remediation ------------------------------------------------------------------------

    def drain(self, cluster, node, reason):
        conf = self.paths(cluster).conf
        run_client(conf, "scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason[:100]}")

    def resume(self, cluster, node):
        conf = self.paths(cluster).conf
        result = run_client(conf, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
        if result.returncode != 0 and "Invalid node state" not in result.stderr:
            raise TransientBackendError(f"scontrol could not resume {node}: {result.stderr.strip()}")

    def kill_node(self, cluster, node):
        """What a dead machine looks like to Slurm: its slurmd and its job steps vanish at once."""
        paths = self.paths(cluster)
        pids = processes.find_pids("slurmd", str(paths.conf), node) + processes.job_processes(str(paths.conf), node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def reboot(self, cluster, node, wipe=False):
        """Restart the node as a machine reboot would: Slurm is told first (state DOWN), so the jobs on
        it end (requeueable ones are requeued) instead of waiting on steps that vanished; then its
        slurmd and job steps die, a new slurmd starts, and we wait until that slurmd has registered."""
        paths = self.paths(cluster)
        before = self.slurmd_start_time(paths, node)
        run_client(paths.conf, "scontrol", "update", f"nodename={node}", "state=down", "reason=tcc reboot", check=False)
        self.kill_node(cluster, node)
        processes.wait_for(lambda: not processes.find_pids("slurmd", str(paths.conf), node), timeout=10)
        if wipe:
            shutil.rmtree(paths.spool / node, ignore_errors=True)
        self.start_slurmd(cluster, paths, node)
        self.wait_registered(paths, node, before)

    def reinstall(self, cluster, node):
        """A reboot from a wiped node folder: the local stand-in for a fresh image."""
        self.reboot(cluster, node, wipe=True)

    def clean_scratch(self, cluster, node):
        scratch = self.paths(cluster).spool / node / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)

    def hold(self, cluster, name, nodes):
        """A reservation for root: FLEX lets a scan job asking for it use unheld nodes too (scheduled by
        backfill, hence bf_interval=2 in slurm.conf); IGNORE_JOBS lets it cover a node that has jobs."""
        paths = self.paths(cluster)
        conf = paths.conf
        held = self.scontrol_fields(paths, "reservation", name).get("Nodes")
        if held:
            expanded = run_client(conf, "scontrol", "show", "hostnames", held).stdout.split()
            nodes = sorted(set(expanded) | set(nodes))
            args = ["update", f"reservationname={name}", f"nodes={','.join(nodes)}"]
        else:
            args = ["create", "reservation", f"reservationname={name}", f"nodes={','.join(nodes)}", "users=root"]
            args += ["starttime=now", "duration=infinite", "flags=flex,ignore_jobs"]
        result = run_client(conf, "scontrol", *args, check=False)
        if result.returncode != 0:
            raise TransientBackendError(f"Slurm refused hold {name} on {', '.join(nodes)}: {result.stderr.strip()}")

    def release(self, cluster, name):
        """Delete the reservation; Slurm refuses while a job that asked for it is still completing."""
        conf = self.paths(cluster).conf
        errors = []

        def deleted():
            result = run_client(conf, "scontrol", "delete", f"reservationname={name}", check=False)
            errors[:] = [result.stderr.strip()]
            gone = ("Invalid reservation name", "Requested reservation is invalid")
            return result.returncode == 0 or any(text in result.stderr for text in gone)

        if not processes.wait_for(deleted, timeout=30, interval=0.5):
            raise TransientBackendError(f"Slurm would not end hold {name}: {errors[0]}")

    def scontrol_fields(self, paths, kind, name):
        """`scontrol show <kind> <name> -o` as a dict of its Key=Value fields ({} when Slurm knows none)."""
        result = run_client(paths.conf, "scontrol", "show", kind, name, "-o", check=False)
        return dict(f.split("=", 1) for f in result.stdout.split() if "=" in f)

    def node_fields(self, paths, node):
        return self.scontrol_fields(paths, "node", node)

    def slurmd_start_time(self, paths, node):
        """When the node's current slurmd registered (scontrol's SlurmdStartTime), or "None"."""
        return self.node_fields(paths, node).get("SlurmdStartTime", "None")

    def wait_registered(self, paths, node, before, steady=1.5):
        """Wait until a new slurmd (registered after `before`) has answered for `steady` seconds: just
        after registering, the controller may still flag the node NOT_RESPONDING for a moment (measured:
        set within 0.4 s of the restart, cleared by 0.9 s), and a job sent then would fail."""
        since = None

        def registered():
            nonlocal since
            fields = self.node_fields(paths, node)
            started = fields.get("SlurmdStartTime", "None")
            if started in ("None", before) or "NOT_RESPONDING" in fields.get("State", ""):
                since = None
                return False
            since = since or time.monotonic()
            return time.monotonic() - since >= steady

        if not processes.wait_for(registered, timeout=settings.LOCAL_NODE_IDLE_TIMEOUT, interval=0.3):
            raise TransientBackendError(f"{node} did not register with slurmctld after its restart")

    # -- helpers ------------------------------------------------------------------------------

    def paths(self, cluster):
        return ClusterPaths(Path(settings.LOCAL_CLUSTERS_DIR) / f"c{cluster.pk}")

    def client_env(self, cluster):
        """Environment for running Slurm commands against this cluster from the login shell."""
        return {"SLURM_CONF": str(self.paths(cluster).conf)}

    def prepare(self, paths):
        missing = preflight.problem()
        if missing:
            raise PermanentBackendError(missing)
        for folder in (paths.root, paths.munge_dir, paths.state, paths.spool, paths.logs, paths.jobs):
            folder.mkdir(parents=True, exist_ok=True)
        paths.munge_dir.chmod(0o755)
        paths.secrets.mkdir(mode=0o700, exist_ok=True)
        write_secret(paths.munge_key, 128)
        write_secret(paths.jwt_key, 32)
        self.write_health_check(paths)
        blocked = [str(p) for p in paths.root.parents if p.stat().st_mode & 0o001 == 0]
        if blocked:
            # slurmrestd runs as nobody and must reach slurm.conf.
            raise PermanentBackendError(
                f"LOCAL_CLUSTERS_DIR must be reachable by every user; {blocked[0]} is not (chmod o+x)"
            )
        if len(str(paths.munge_socket)) > 100:
            raise PermanentBackendError(
                f"LOCAL_CLUSTERS_DIR is too deep for munge's socket ({paths.munge_socket}); choose a shorter path"
            )

    def write_health_check(self, paths):
        """Slurm's HealthCheckProgram for every node: drains a node whose spool disk is nearly full.

        slurmd runs it as root with only SLURMD_NODENAME set, so it names every path in full.
        """
        faults = paths.root / "faults"
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
        path = paths.root / "healthcheck.sh"
        if not path.exists() or path.read_text() != script:
            path.write_text(script)
            path.chmod(0o755)

    def start_munged(self, paths):
        if processes.find_pids("munged", str(paths.munge_socket)):
            return
        result = processes.start_daemon(
            [
                processes.program("munged"),
                "--force",
                f"--socket={paths.munge_socket}",
                f"--key-file={paths.munge_key}",
                f"--pid-file={paths.munge_dir / 'munged.pid'}",
                f"--log-file={paths.logs / 'munged.log'}",
                f"--seed-file={paths.munge_dir / 'munged.seed'}",
            ]
        )
        if not processes.wait_for(paths.munge_socket.exists, timeout=10):
            raise TransientBackendError(f"munged did not start: {result.stderr.strip() or 'no socket after 10 s'}")

    def assign_ports(self, cluster, wanted):
        ports = dict(cluster.backend_state.get("ports", {}))
        nodes = {n: p for n, p in ports.get("nodes", {}).items() if n in {w.name for w in wanted}}
        taken = self.ports_in_use() | set(nodes.values())
        for daemon in ("slurmctld", "slurmrestd"):
            if daemon not in ports:
                ports[daemon] = self.pick_port(taken)
            taken.add(ports[daemon])
        for node in wanted:
            if node.name not in nodes:
                nodes[node.name] = self.pick_port(taken)
                taken.add(nodes[node.name])
        ports["nodes"] = nodes
        self.save_state(cluster, ports=ports)

    def ports_in_use(self):
        from ...models import Cluster

        used = set()
        for state in (
            Cluster.objects.filter(backend=self.name)
            .exclude(status=ClusterStatus.DELETED)
            .values_list("backend_state", flat=True)
        ):
            ports = (state or {}).get("ports", {})
            used.update([ports.get("slurmctld"), ports.get("slurmrestd"), *ports.get("nodes", {}).values()])
        return used

    def pick_port(self, taken):
        low, high = settings.LOCAL_PORT_RANGE
        for _ in range(200):
            port = random.randint(low, high)
            if port not in taken and port_is_free(port):
                return port
        raise TransientBackendError(f"no free port found between {low} and {high}")

    def render_conf(self, cluster, paths, wanted):
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
            f"HealthCheckProgram={paths.root}/healthcheck.sh",
            "HealthCheckInterval=10",
            "HealthCheckNodeState=ANY",
            "",
        ]
        by_pool, shapes = {}, {}
        for node in wanted:
            shape = shapes.setdefault(node.node_pool_id, self.node_shape(cluster, node.node_pool))
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
            lines.append(
                f"PartitionName={partition.name} Nodes={','.join(names)} Default={default} MaxTime=INFINITE State=UP"
            )
        return "\n".join(lines) + "\n"

    def write_conf(self, cluster, paths, wanted):
        text = self.render_conf(cluster, paths, wanted)
        if paths.conf.exists() and paths.conf.read_text() == text:
            return
        tmp = paths.root / ".slurm.conf.tmp"
        tmp.write_text(text)
        os.replace(tmp, paths.conf)

    def conf_digest(self, paths):
        return hashlib.sha256(paths.conf.read_bytes()).hexdigest()

    def start_slurmctld(self, cluster, paths):
        """Start slurmctld, or restart it if it runs with an older node list (Slurm 22.05 needs that)."""
        digest = self.conf_digest(paths)
        running = processes.find_pids("slurmctld", str(paths.conf))
        if running and cluster.backend_state.get("slurmctld_conf") == digest:
            return
        if running:
            processes.stop(running)
        result = processes.start_daemon([processes.program("slurmctld"), "-f", str(paths.conf)])
        if result.returncode != 0:
            raise TransientBackendError(f"slurmctld failed to start: {result.stderr.strip()}")
        if not processes.wait_for(lambda: self.controller_up(paths), timeout=30, interval=0.2):
            raise TransientBackendError(f"slurmctld is not answering; see {paths.logs / 'slurmctld.log'}")
        self.save_state(cluster, slurmctld_conf=digest)

    def controller_up(self, paths):
        result = run_client(paths.conf, "scontrol", "ping", timeout=5, check=False)
        return "UP" in result.stdout

    def start_slurmrestd(self, cluster, paths):
        """slurmrestd on 127.0.0.1 with JWT auth; it refuses to run as root, so it runs as nobody.

        Only the slurm/v0.0.38 plugin is loaded: the slurmdb ones refuse to start without slurmdbd.
        """
        running = processes.find_pids("slurmrestd", str(paths.conf))
        if running and cluster.backend_state.get("slurmrestd_conf") == self.conf_digest(paths):
            return
        processes.stop(running)
        port = cluster.backend_state["ports"]["slurmrestd"]
        log = open(paths.logs / "slurmrestd.log", "ab")  # noqa: SIM115 - handed to the daemon
        # setsid -f: slurmrestd runs in the foreground; the extra fork leaves no zombie in the worker.
        subprocess.Popen(
            [
                "setsid",
                "-f",
                processes.program("slurmrestd"),
                "-f",
                str(paths.conf),
                "-a",
                "rest_auth/jwt",
                "-s",
                "openapi/v0.0.38",
                "-u",
                "nobody",
                f"127.0.0.1:{port}",
            ],
            env={"SLURM_JWT": "daemon", "SLURM_CONF": str(paths.conf), "PATH": "/usr/bin:/bin"},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=paths.root,
        )
        if not processes.wait_for(lambda: not port_is_free(port), timeout=15):
            raise TransientBackendError(f"slurmrestd did not start; see {paths.logs / 'slurmrestd.log'}")
        self.save_state(cluster, slurmrestd_conf=self.conf_digest(paths))

    def call_slurm_rest(self, cluster, method, path, body=None):
        """Forward one request to the cluster's slurmrestd as root, with a short-lived JWT."""
        import urllib.error
        import urllib.request

        paths = self.paths(cluster)
        port = cluster.backend_state.get("ports", {}).get("slurmrestd")
        if not port:
            raise PermanentBackendError("this cluster has no slurmrestd (it was created before slurmrestd was added)")
        token = run_client(paths.conf, "scontrol", "token", "username=root", "lifespan=300").stdout.strip()
        token = token.split("=", 1)[1] if token.startswith("SLURM_JWT=") else token
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            method=method,
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError as exc:
            raise TransientBackendError(f"slurmrestd is not answering: {exc}") from None

    def start_slurmd(self, cluster, paths, node):
        if processes.find_pids("slurmd", str(paths.conf), node):
            return
        if settings.LOCAL_NODE_START_DELAY:
            time.sleep(settings.LOCAL_NODE_START_DELAY)
        (paths.spool / node).mkdir(parents=True, exist_ok=True)
        result = processes.start_daemon([processes.program("slurmd"), "-f", str(paths.conf), "-N", node])
        if result.returncode != 0:
            raise TransientBackendError(f"slurmd {node} failed to start: {result.stderr.strip()}")
        started = cluster.backend_state.get("slurmd_conf", {})
        self.save_state(cluster, slurmd_conf={**started, node: self.conf_digest(paths)})

    def stop_slurmd(self, paths, node):
        processes.stop(processes.find_pids("slurmd", str(paths.conf), node))

    def reconfigure(self, cluster, paths, names):
        """Make slurmds started with an older slurm.conf read the new one."""
        digest = self.conf_digest(paths)
        started = {n: d for n, d in cluster.backend_state.get("slurmd_conf", {}).items() if n in names}
        if all(conf == digest for conf in started.values()):
            return
        run_client(paths.conf, "scontrol", "reconfigure", timeout=30)
        self.save_state(cluster, slurmd_conf=dict.fromkeys(started, digest))

    def wait_idle(self, paths, names):
        def not_ready():
            statuses = {s.name: s for s in parse_sinfo(run_client(paths.conf, "sinfo", "--json").stdout)}
            return {
                name: statuses[name].display_state if name in statuses else "missing"
                for name in names
                if name not in statuses
                or statuses[name].state not in ("idle", "mixed", "allocated")
                or "NOT_RESPONDING" in statuses[name].flags
            }

        deadline = time.monotonic() + settings.LOCAL_NODE_IDLE_TIMEOUT
        waiting = not_ready()
        while waiting and time.monotonic() < deadline:
            time.sleep(0.2)
            waiting = not_ready()
        if waiting:
            detail = ", ".join(f"{n}: {s}" for n, s in sorted(waiting.items()))
            raise TransientBackendError(
                f"nodes did not become idle within {settings.LOCAL_NODE_IDLE_TIMEOUT:.0f} s ({detail})"
            )
