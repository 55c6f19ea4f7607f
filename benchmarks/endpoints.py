"""Inference endpoint figures on real parts: a local Slurm cluster whose replicas serve a tiny Llama
(recipes/node/serve.py), the router process (`manage.py router`) and an MLflow server.

- :predict p50/p95 latency and requests/s through the router with 1 and 2 replicas, and straight to one
  replica (the router's overhead as a ratio);
- an alias-style roll (v1 -> v2, one replica): seconds from the change until the old replica stopped,
  and the answers (by HTTP status) to what `roll clients` clients sent meanwhile, each calling again as
  soon as it is answered (the router's queue is sized to hold them all, so any answer but 200 is one
  the roll cost).

The reconcile loop runs in this process (what the Celery beat task runs every few seconds).
Usage: .venv/bin/python benchmarks/endpoints.py [requests per measure (300)] [clients (4)] [roll clients (1)]
"""

import collections
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from _setup import ROOT, WORK, bench_project, scratch_django


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


MLFLOW_PORT, ROUTER_PORT = free_port(), free_port()
ROLL_CLIENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 1
scratch_django(
    CELERY_TASK_ALWAYS_EAGER="1",  # operations the reconcile starts (staging a version) run in its thread
    ROUTER_QUEUE_PER_REPLICA=str(max(32, ROLL_CLIENTS)),  # every roll client waits its turn, none is refused
    MLFLOW_TRACKING_URI=f"http://127.0.0.1:{MLFLOW_PORT}",
    MLFLOW_PASSWORD_FILE=str(WORK / "mlflow" / "password"),  # scripts/mlflow.sh's, for the folder it is given
    ROUTER_PORT=str(ROUTER_PORT),
    ROUTER_SAMPLE_SECONDS="1",
    ROUTER_REFRESH_SECONDS="0.3",
)

from clusters import services as cluster_services  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.operations import engine  # noqa: E402
from console.models import APIToken  # noqa: E402
from recipes import serving  # noqa: E402
from recipes.models import Endpoint, EndpointStatus, Replica, ReplicaState  # noqa: E402


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


def post(url, body, token=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 599


def measure(url, token, requests, clients):
    """(p50 ms, p95 ms, requests/s, failures) of `requests` :predict calls from `clients` threads."""
    latencies, failures, lock = [], [0], threading.Lock()
    per_client = requests // clients
    body = {"instances": [{"prompt": "The cluster", "max_tokens": 8}]}

    def client():
        for _ in range(per_client):
            started = time.perf_counter()
            status = post(url, body, token)
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)
                failures[0] += status != 200

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))], len(ordered) / elapsed, failures[0]


class Reconciler(threading.Thread):
    def __init__(self, endpoint):
        super().__init__(daemon=True)
        self.endpoint, self.running = endpoint, True

    def run(self):
        while self.running:
            serving.reconcile(Endpoint.objects.select_related("project", "cluster", "serving").get(
                pk=self.endpoint.pk))  # fmt: skip
            time.sleep(0.5)


def main(requests, clients):
    user, project = bench_project()
    _, token = APIToken.issue(user, "bench")
    mlflow = subprocess.Popen(["bash", "scripts/mlflow.sh", str(WORK / "mlflow"), str(MLFLOW_PORT)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    router = subprocess.Popen([sys.executable, "manage.py", "router"], cwd=ROOT, env=dict(os.environ),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    spec = json.loads((ROOT / "examples" / "cluster-local-cpu.json").read_text())
    operation = cluster_services.create_cluster(project=project, name="bench", spec=spec, user=user)
    engine.run(operation.pk)
    cluster = Cluster.objects.get(pk=operation.cluster_id)
    reconciler = None
    try:

        def mlflow_up():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{MLFLOW_PORT}/health", timeout=2).status == 200
            except OSError:
                return False

        wait_for(mlflow_up, 120, "MLflow")
        sys.path.insert(0, str(ROOT))
        from tests.factories import a_version

        a_version(project, "tiny", WORK)
        a_version(project, "tiny", WORK)
        fields = {"name": "bench", "cluster": "bench", "model": "tiny", "version": 1, "min_replicas": 1,
                  "max_replicas": 1}  # fmt: skip
        endpoint = serving.create_endpoint(project, fields, user)
        reconciler = Reconciler(endpoint)
        reconciler.start()
        routed = f"http://127.0.0.1:{ROUTER_PORT}/bench/bench:predict"
        ready = Replica.objects.filter(endpoint=endpoint, state=ReplicaState.READY)
        wait_for(lambda: ready.count() == 1, 180, "one replica")
        wait_for(lambda: post(routed, {"instances": ["x"]}, token) == 200, 30, "the router")
        measure(routed, token, clients * 5, clients)  # warm both paths
        replica = ready.first()
        rows = [("router, 1 replica", measure(routed, token, requests, clients)),
                ("direct, 1 replica", measure(f"{replica.url}/predict", replica.token, requests, clients))]  # fmt: skip
        serving.change_endpoint(endpoint, {"min_replicas": 2, "max_replicas": 2})
        wait_for(lambda: ready.count() == 2, 180, "two replicas")
        time.sleep(1)
        rows.append(("router, 2 replicas", measure(routed, token, requests, clients)))
        print(f"{requests} :predict requests (8 new tokens each) from {clients} clients")
        print("path               | p50 ms | p95 ms | requests/s | failed")
        for label, (p50, p95, rate, failed) in rows:
            print(f"{label:18} | {p50:6.1f} | {p95:6.1f} | {rate:10.1f} | {failed}")
        print(f"router overhead (p50 router / direct, 1 replica): {rows[0][1][0] / rows[1][1][0]:.2f}x; "
              f"2 replicas vs 1 (requests/s): {rows[2][1][2] / rows[0][1][2]:.2f}x")  # fmt: skip

        # Roll v1 -> v2 on one replica while a client keeps calling.
        serving.change_endpoint(endpoint, {"min_replicas": 1, "max_replicas": 1})
        wait_for(lambda: Replica.objects.filter(endpoint=endpoint, state__in=ReplicaState.running()).count() == 1,
                 60, "one replica again")  # fmt: skip
        statuses, running = [], [True]

        def caller():
            while running[0]:
                statuses.append(post(routed, {"instances": ["x"]}, token))

        threads = [threading.Thread(target=caller) for _ in range(ROLL_CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(2)  # every client has a request in flight or queued
        statuses.clear()
        started = time.monotonic()
        serving.change_endpoint(endpoint, {"version": 2})
        old = Replica.objects.filter(endpoint=endpoint, version__version=1, state__in=ReplicaState.running())
        wait_for(lambda: not old.exists(), 180, "the roll")
        rolled = time.monotonic() - started
        running[0] = False
        for thread in threads:
            thread.join()
        answers = ", ".join(f"{n} x {code}" for code, n in sorted(collections.Counter(statuses).items()))
        print(f"roll v1 -> v2 under {ROLL_CLIENTS} client(s): {rolled:.1f} s until the old replica stopped (drained "
              f"once nothing was in flight); answers during it: {answers or 'none'} (599: no answer)")  # fmt: skip
    finally:
        if reconciler:
            reconciler.running = False
        for endpoint in Endpoint.objects.exclude(status=EndpointStatus.DELETED):
            serving.delete_endpoint(endpoint)
            serving.reconcile(endpoint)
        engine.run(cluster_services.delete_cluster(cluster=cluster, user=user).pk)
        router.terminate()
        os.killpg(mlflow.pid, 15)
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300, int(sys.argv[2]) if len(sys.argv) > 2 else 4)
