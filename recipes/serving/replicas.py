"""An endpoint's replicas: each a Slurm job serving one version (recipes/node/serve.py), started,
followed from its announce file and /health, drained and stopped."""

import contextlib
import json
import secrets
import shlex
import urllib.request

from django.conf import settings
from django.utils import timezone

from clusters import services as clusters
from clusters.slurm import batch, states
from console.errors import ConsoleError

from .. import registry
from ..models import ModelVersion, Replica, ReplicaState
from ..partitions import default_partition, smallest_node
from .endpoints import event


def wanted_version(endpoint):
    if endpoint.alias:
        return registry.resolve(endpoint.project, f"{endpoint.model_name}@{endpoint.alias}")
    return ModelVersion.objects.get(project=endpoint.project, name=endpoint.model_name, version=endpoint.version)


def replica_script(endpoint, replica, staged, runtime):
    home = clusters.shared_dir(endpoint.cluster)
    folder = f"{home}/{replica.folder}"
    partition = default_partition(endpoint.cluster)
    node = smallest_node(endpoint.cluster, partition) if partition else None  # GPUs: the partition's fewest
    gpus = min(max(endpoint.gpus_per_replica, 1), node.gpus) if node and node.gpus else 0
    engine = ["--engine", "vllm", "--gpus", str(gpus)] if gpus else []  # vLLM's tensor parallel size
    cpus, memory = 1, None
    if gpus:
        # The node's CPUs and memory in proportion to its GPUs taken (vLLM's tokenizer and scheduler
        # threads, and host memory to load the weights through), a tenth of the memory left to the OS.
        share = gpus / node.gpus
        cpus = max(1, int(node.cpus * share))
        memory = f"{int(node.memory_mb * share * 0.9)}M" if node.memory_mb else None
    command = [
        runtime.python, "-m", "recipes.node.serve", "--model", f"{home}/{staged}", "--served-name", endpoint.name,
        "--version", replica.version_ref, "--announce", f"{folder}/announce.json",
        "--token-file", f"{folder}/token", "--bind", "node", "--ports", "{}-{}".format(*settings.SERVING_REPLICA_PORTS),
        *engine,
    ]  # fmt: skip
    return batch.render(
        {
            "job-name": f"serve-{endpoint.name}-{replica.pk}",
            "partition": partition or None,
            "nodes": 1,
            "ntasks": 1,
            "cpus-per-task": cpus,
            "mem": memory,
            "gpus-per-node": gpus or None,
            "output": f"{folder}/slurm-%j.out",
        },
        environment={"XDG_CACHE_HOME": f"{folder}/.cache", "HF_HOME": f"{folder}/.cache/huggingface"},
        folder=runtime.folder,
        body=["exec srun " + " ".join(shlex.quote(word) for word in command)],
    )


def start(endpoint, version, staged):
    """Submit a replica of `version`, whose folder `staged` is in the cluster's shared home already."""
    runtime = clusters.node_runtime(endpoint.cluster)
    replica = Replica.objects.create(endpoint=endpoint, version=version, version_ref=version.ref,
                                     token=secrets.token_urlsafe(32))  # fmt: skip
    replica.folder = f"endpoints/{endpoint.uuid}/replica-{replica.pk}"
    script = replica_script(endpoint, replica, staged, runtime)
    # 0600, and the job's account's once submit_batch hands the folder over: not the project's other members'.
    clusters.write_file(endpoint.cluster, f"{replica.folder}/token", replica.token, mode=0o600)
    clusters.write_file(endpoint.cluster, f"{replica.folder}/serve.sbatch", script)
    try:
        replica.slurm_job_id = clusters.submit_batch(endpoint.cluster, f"{replica.folder}/serve.sbatch",
                                                     user=endpoint.created_by)  # fmt: skip
    except ConsoleError as exc:
        replica.state, replica.error, replica.stopped_at = ReplicaState.FAILED, exc.message[:300], timezone.now()
        replica.save()
        event(endpoint, f"Replica {replica.pk} ({version.ref}) could not be submitted: {exc.message}")
        return replica
    replica.save()
    event(endpoint, f"Replica {replica.pk} ({version.ref}) submitted as Slurm job {replica.slurm_job_id}")
    return replica


def healthy(replica, timeout=2):
    try:
        with urllib.request.urlopen(f"{replica.url}/health", timeout=timeout) as answer:
            return answer.status == 200
    except (OSError, ValueError):
        return False


def in_flight(replica, timeout=2):
    """Requests the replica is working on or has queued, as it counts them itself (it sees every
    router's requests): serve.py's /health says `in_flight`; vLLM's /metrics has
    vllm:num_requests_running and vllm:num_requests_waiting (https://docs.vllm.ai/en/latest/usage/metrics.html).
    None when it does not answer or says neither."""
    try:
        with urllib.request.urlopen(f"{replica.url}/health", timeout=timeout) as answer:
            said = json.loads(answer.read() or b"null")
        if isinstance(said, dict) and isinstance(said.get("in_flight"), int):
            return said["in_flight"]
        with urllib.request.urlopen(f"{replica.url}/metrics", timeout=timeout) as answer:
            text = answer.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    counts = [float(line.rsplit(None, 1)[-1]) for line in text.splitlines()
              if line.split("{", 1)[0].split(" ", 1)[0] in names]  # fmt: skip
    return round(sum(counts)) if counts else None


def routers_moved_on():
    """Seconds after a drain began when no router sends the replica a new request: each has re-read
    its table (two refreshes, one may have just begun) and a connection it opened before is made or
    given up (the connect timeout)."""
    return 2 * settings.ROUTER_REFRESH_SECONDS + settings.ROUTER_CONNECT_TIMEOUT


def drained(replica, now):
    """Why a DRAINING replica may be stopped now, or None while it still serves requests it was sent.
    It stops once nothing is in flight there, and at the latest ENDPOINT_DRAIN_SECONDS after the drain
    began (at least the router's request timeout: after that no request of its can still be open)."""
    waited = (now - replica.draining_at).total_seconds()
    if waited < routers_moved_on():
        return None
    if waited >= settings.ENDPOINT_DRAIN_SECONDS:
        return f"drained: {settings.ENDPOINT_DRAIN_SECONDS:g} s passed, the longest a request may run"
    busy = in_flight(replica)
    if busy == 0:
        return "drained: no request in flight"
    if busy is None and job_ended(replica):
        return "its job ended while draining"
    return None


def job_ended(replica):
    try:
        job = clusters.job_status(replica.endpoint.cluster, replica.slurm_job_id)
    except ConsoleError:
        return False  # Slurm not answering: judge it later
    return job is None or job.state not in states.JOB_ACTIVE


def stop(replica, state=ReplicaState.STOPPED, why=""):
    if replica.slurm_job_id:
        # Gone already, or Slurm silent: the job ends with the endpoint's cluster anyway.
        with contextlib.suppress(ConsoleError):
            clusters.cancel_job(replica.endpoint.cluster, replica.slurm_job_id)
    if replica.set_state(state, expected=ReplicaState.running(), stopped_at=timezone.now(), error=why[:300]):
        event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) {state.label.lower()}"
                                + (f": {why}" if why else ""))  # fmt: skip


def follow(replica, now=None):
    """Move a STARTING or READY replica on from what its job, announce file and /health say. One that
    is not serving ENDPOINT_START_SECONDS after it was made (queued that long, or its engine never
    loads) has failed."""
    if replica.state == ReplicaState.STARTING:
        waited = ((now or timezone.now()) - replica.created).total_seconds()
        if waited > settings.ENDPOINT_START_SECONDS:
            limit = settings.ENDPOINT_START_SECONDS
            stop(replica, ReplicaState.FAILED, f"not serving {limit:g} s after it was submitted")
            return
        if not replica.host:
            try:
                host, port, node = announced_at(replica)
            except (ConsoleError, ValueError, KeyError, TypeError):
                host = port = node = None
            if not host:
                if job_ended(replica):
                    stop(replica, ReplicaState.FAILED, "its job ended before it served")
                return
            Replica.objects.filter(pk=replica.pk).update(host=host, port=port, node=node)
            replica.host, replica.port, replica.node = host, port, node
        if healthy(replica) and replica.set_state(ReplicaState.READY, expected=[ReplicaState.STARTING],
                                                  ready_at=timezone.now()):  # fmt: skip
            event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) ready on {replica.node} at "
                                    f"{replica.url}")  # fmt: skip
    elif replica.state == ReplicaState.READY and not healthy(replica) and job_ended(replica):
        stop(replica, ReplicaState.FAILED, "its job ended")


def announced_at(replica):
    """(host, port, node) of a replica that announced itself: the port from its announce file (the job
    writes it, so nothing else of it is trusted), the node and its address from Slurm (where its job
    runs). A host the file names is never used: the router and the console would send requests wherever
    a user's job pointed them. (None, None, None) until both are known (nodes of one machine, as the
    local backend's, share an address: the node tells the replicas apart)."""
    raw = clusters.read_file(replica.endpoint.cluster, f"{replica.folder}/announce.json")
    port = json.loads(raw)["port"]
    low, high = settings.SERVING_REPLICA_PORTS
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= high:
        raise ValueError(f"replica {replica.pk} announced port {port!r}, outside {low}-{high}")
    node, host = clusters.job_node(replica.endpoint.cluster, replica.slurm_job_id)
    return (host, port, node) if host else (None, None, None)


def drain(replica, why):
    if replica.state == ReplicaState.STARTING:
        stop(replica, why=why)
    elif replica.set_state(ReplicaState.DRAINING, expected=[ReplicaState.READY], draining_at=timezone.now()):
        event(replica.endpoint, f"Replica {replica.pk} ({replica.version_ref}) draining: {why}")
