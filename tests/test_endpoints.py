"""Inference endpoints on real parts: a real MLflow server holds the versions, replicas are Slurm jobs
on a real local cluster serving a tiny model (recipes/node/serve.py), a real router process
(`manage.py router`) sits in front, and a real Celery worker with beat reconciles and autoscales.

alice runs project "alpha"; charlie is an outsider. Timings are the tests' (reconcile every 1 s,
samples every 1 s, scale after 4 s, idle after 8 s, requests of at most 10 s).
"""

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from clusters import processes
from clusters.models import Operation
from console.errors import FieldErrors
from recipes import registry
from recipes.models import Endpoint, EndpointStatus, Replica, ReplicaState
from recipes.node import chat

from .conftest import Worker, api_client_for, example_spec, purge_queue, stop_local_clusters, wait_until
from .factories import a_version, call, connected_in_a_burst, fresh

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {
    "SLURM_SYNC_SECONDS": 2,
    "ENDPOINT_RECONCILE_SECONDS": 1,
    "ENDPOINT_SCALE_WINDOW_SECONDS": 4,
    "ENDPOINT_SCALE_COOLDOWN_SECONDS": 4,
    "ENDPOINT_SCALE_DOWN_IDLE_SECONDS": 8,
    "ROUTER_REQUEST_TIMEOUT": 10,  # and so a drain of at most 13.6 s (10 + 2 x 0.3 + 3)
    "ROUTER_SAMPLE_SECONDS": 1,
    "ROUTER_REFRESH_SECONDS": 0.3,
}


@pytest.fixture(scope="module")
def serving_worker(redis_broker, tmp_path_factory):
    purge_queue(redis_broker)
    worker = Worker(tmp_path_factory.mktemp("worker") / "worker.log", beat=True, **FAST)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """The router process on the test settings and database, as `manage.py router` runs it."""
    log = tmp_path_factory.mktemp("router") / "router.log"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "CONSOLE_WORKER_USES_TEST_DB": "1",
           **{k: str(v) for k, v in FAST.items()}}  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "manage.py", "router"], cwd=settings.BASE_DIR, env=env,
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{settings.ROUTER_PORT}"

    def up():
        assert process.poll() is None, log.read_text()
        try:
            urllib.request.urlopen(f"{base}/none/none/v1/models", timeout=1)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    wait_until(up, timeout=60, message="the router to listen")
    yield base, log
    process.terminate()
    process.wait(timeout=20)


class Client(threading.Thread):
    """Sends completions one after another until stopped, keeping every answer's status and version."""

    def __init__(self, base, token):
        super().__init__(daemon=True)
        self.base, self.token, self.answers, self.running = base, token, [], True

    def run(self):
        while self.running:
            try:
                status, body = call(self.base, "/alpha/chat/v1/completions", {"prompt": "hi", "max_tokens": 4},
                                    self.token)  # fmt: skip
            except OSError as exc:
                status, body = 599, {"error": str(exc)}
            self.answers.append((status, body.get("system_fingerprint")))

    def stop(self):
        self.running = False
        self.join(timeout=90)
        return self.answers


def timeline(endpoint):
    """The endpoint's events, replicas and its cluster's operations with their times, for a failure's message."""
    lines = [f"{e.time:%H:%M:%S.%f} {e.message}" for e in Endpoint.objects.get(pk=endpoint.pk).events.order_by("time")]
    lines += [f"replica {r.pk} {r.version_ref} {r.state} created {r.created:%H:%M:%S} ready {r.ready_at} "
              f"draining {r.draining_at} stopped {r.stopped_at} {r.error}"
              for r in endpoint.replicas.all()]  # fmt: skip
    lines += [f"operation {o.kind} {o.status} created {o.created:%H:%M:%S} started {o.started} "
              f"finished {o.finished} {o.error}"
              for o in Operation.objects.filter(cluster=endpoint.cluster).order_by("created")]  # fmt: skip
    return "\n".join(lines)


def events(endpoint):
    return [e.message for e in Endpoint.objects.get(pk=endpoint.pk).events.all()]


def test_an_endpoint_serves_an_alias_rolls_when_it_moves_and_scales_with_load(
    serving_worker, router, slurm, mlflow_server, alpha, alice, alice_api, charlie, charlies_project, client, tmp_path
):
    from clusters.choices import OperationStatus

    created = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "serve", "spec": example_spec(cpu=2)},
                             format="json")  # fmt: skip
    assert created.status_code == 202, created.content
    router, router_log = router
    try:
        made = Operation.objects.filter(uuid=created.json()["id"], status__in=OperationStatus.done())
        operation = wait_until(made.first, timeout=180, message="the cluster")
        assert operation.status == OperationStatus.SUCCEEDED, operation.error
        name = fresh()
        v1 = a_version(alpha, name, tmp_path)
        a_version(alpha, name, tmp_path, losses=(1.4, 1.2))
        registry.set_alias(alpha, name, "production", 1)
        from console.models import APIToken

        _, token = APIToken.issue(alice, "serving")
        _, outsider = APIToken.issue(charlie, "outsider")

        response = alice_api.post("/api/v1/projects/alpha/endpoints/", {"name": "chat", "cluster": "serve",
                                  "model": name, "alias": "production", "min_replicas": 1, "max_replicas": 2,
                                  "target_in_flight": 1}, format="json")  # fmt: skip
        assert response.status_code == 201, response.content
        endpoint = Endpoint.objects.get(name="chat")
        wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.READY, timeout=180,
                   interval=1, message="the endpoint to serve")  # fmt: skip

        # Both protocols answer from v1 (once the router's table, read every 0.3 s here, has the replica).
        first = {"prompt": "hello", "max_tokens": 5}
        wait_until(lambda: call(router, "/alpha/chat/v1/completions", first, token)[0] != 503, timeout=10,
                   message=f"the router to route: {router_log.read_text()[-2000:]}")  # fmt: skip
        status, body = call(router, "/alpha/chat/v1/completions", first, token)
        assert status == 200 and body["system_fingerprint"] == f"{name}:v1" and body["object"] == "text_completion"
        status, body = call(router, "/alpha/chat/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}]}, token)  # fmt: skip
        assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
        status, body = call(router, "/alpha/chat:predict", {"instances": ["a", {"prompt": "b", "max_tokens": 3}]},
                            token)  # fmt: skip
        assert status == 200 and len(body["predictions"]) == 2 and body["deployedModelId"] == f"{name}:v1"
        status, body = call(router, "/alpha/chat/v1/models", token=token)
        assert [m["id"] for m in body["data"]] == ["chat", f"{name}:v1", f"{name}@production"]
        with_the_openai_sdk(router, token, name)
        # Bad input: clear 400s in each protocol's shape; outsiders and strangers get 404.
        status, body = call(router, "/alpha/chat:predict", raw=b"not json", token=token)
        assert status == 400 and "must be JSON" in body["error"]["message"] and body["error"]["code"] == 400
        status, body = call(router, "/alpha/chat/v1/completions", {"prompt": "x" * 300}, token)
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert call(router, "/alpha/chat:predict", {"instances": ["a"]}, outsider)[0] == 404
        status, body = call(router, "/alpha/chat:predict", {"instances": ["a"]})
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        charlie_api = api_client_for(charlie)
        assert charlie_api.get("/api/v1/projects/alpha/endpoints/chat/").status_code == 404
        # A version an endpoint serves cannot be deleted.
        refused = alice_api.delete(f"/api/v1/projects/alpha/models/{name}/versions/1/")
        assert refused.status_code == 409 and "served by endpoint chat" in refused.json()["detail"]

        # Moving the alias rolls the endpoint while a client keeps calling: no request fails.
        caller = Client(router, token)
        caller.start()
        wait_until(lambda: len(caller.answers) >= 5, timeout=30, message="the client's first answers")
        assert alice_api.put(f"/api/v1/projects/alpha/models/{name}/aliases/production/", {"version": 2},
                             format="json").status_code == 200  # fmt: skip
        wait_until(lambda: not Replica.objects.filter(endpoint=endpoint, version=v1,
                   state__in=ReplicaState.running()).exists(), timeout=180, interval=1,
                   message=lambda: f"the v1 replica to stop: {timeline(endpoint)}")  # fmt: skip
        print(timeline(endpoint))  # shown when a later step fails
        after = len(caller.answers)
        wait_until(lambda: len(caller.answers) >= after + 5, timeout=30, message="answers after the roll")
        answers = caller.stop()
        assert answers and all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:5]
        assert answers[0][1] == f"{name}:v1" and answers[-1][1] == f"{name}:v2"
        assert any(m.startswith(f"Rolling to {name}:v2") for m in events(endpoint))

        # Load over the target scales up to max; idle scales back down to min.
        load = [Client(router, token) for _ in range(6)]
        for caller in load:
            caller.start()
        wait_until(lambda: Replica.objects.filter(endpoint=endpoint, state=ReplicaState.READY).count() == 2,
                   timeout=180, interval=1, message="a second replica")  # fmt: skip
        answers = [a for caller in load for a in caller.stop()]
        assert len(answers) >= len(load) and all(status == 200 for status, _ in answers), answers[:5]
        assert any(m.startswith("Scaled up to 2 replicas") for m in events(endpoint))
        wait_until(lambda: any(m.startswith("Scaled down to 1 replica") for m in events(endpoint)), timeout=90,
                   interval=1, message="the idle endpoint to scale down")  # fmt: skip

        # The page charts the router's samples; the same series over REST.
        metrics = alice_api.get("/api/v1/projects/alpha/endpoints/chat/metrics/").json()
        assert sum(s["requests_per_s"] for s in metrics["samples"]) > 0
        assert max(s["replicas"] for s in metrics["samples"]) == 2
        client.force_login(alice)
        page = client.get("/endpoints/alpha/chat/").content.decode()
        assert 'id="requests_per_s"' in page and 'id="latency"' in page and 'id="replicas"' in page

        deleted = alice_api.delete("/api/v1/projects/alpha/endpoints/chat/")
        assert deleted.status_code == 202
        wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.DELETED, timeout=60,
                   message="the endpoint to stop")  # fmt: skip
        assert not Replica.objects.filter(endpoint=endpoint, state__in=ReplicaState.running()).exists()
    finally:
        stop_local_clusters()


def with_the_openai_sdk(router, token, name):
    """The official client as a new user would use it: sync and async, whole and streamed, and its
    errors (a wrong key, a model the endpoint does not serve, a field the engine does not honour)."""
    import asyncio

    import openai

    url = f"{router}/alpha/chat/v1"
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0)
    whole = client.completions.create(model="chat", prompt="hello", max_tokens=6)
    assert whole.system_fingerprint == f"{name}:v1" and whole.usage.completion_tokens >= 1
    streamed = list(client.completions.create(model=f"{name}@production", prompt="hello", max_tokens=6, stream=True))
    assert len(streamed) >= 2  # before, the router answered one JSON body: the SDK yielded no chunk at all
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text  # greedy: the same
    chat = client.chat.completions.create(
        model=f"{name}:v1", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(chat)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="tcc_wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="hello", max_tokens=2)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="chat", prompt="hello", max_tokens=2, n=2)
    assert "n must be 1" in refused.value.message

    async def asynchronous():
        async_client = openai.AsyncOpenAI(base_url=url, api_key=token, max_retries=0)
        answer = await async_client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        pieces = [c async for c in await async_client.completions.create(
            model="chat", prompt="hello", max_tokens=6, stream=True)]  # fmt: skip
        await async_client.close()
        return answer, pieces

    answer, pieces = asyncio.run(asynchronous())
    assert answer.choices[0].message.role == "assistant"
    assert "".join(c.choices[0].text for c in pieces if c.choices) == whole.choices[0].text


@pytest.fixture
def deployable(alpha, alice_api, mlflow_server, tmp_path):
    """alpha with a provisioned cluster "demo" (nothing runs) and a model with one version."""
    from .conftest import provisioned

    assert alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": example_spec(cpu=1)},
                          format="json").status_code == 202  # fmt: skip
    provisioned(name="demo")
    name = fresh()
    a_version(alpha, name, tmp_path)
    return name


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas", "min_replicas (3) is more than max_replicas (2)"),
        ({"max_replicas": 99}, "max_replicas", "must be from 1 to 16"),
        ({"model": "nothing"}, "model", "no registered model by that name"),
        ({"version": 7}, "version", "has no version 7"),
        ({"version": 1, "alias": "production"}, "version", "not both"),
        ({"alias": "canary"}, "alias", "has no alias canary"),
        ({"cluster": "elsewhere"}, "cluster", "no such cluster"),
        ({"name": "Chat Bot"}, "name", "lowercase letters"),
        ({"target_in_flight": 0}, "target_in_flight", "from 0.1 to 1000"),
        ({"target_p95_ms": "fast"}, "target_p95_ms", "from 1 to 600000"),
        ({"gpus_per_replica": 2}, "gpus_per_replica", "has no GPUs: replicas run on a CPU"),
    ],
)
def test_a_bad_endpoint_gets_a_400_naming_the_field_and_nothing_is_made(alice_api, deployable, change, field, reason):
    body = {"name": "chat", "cluster": "demo", "model": deployable, "version": 1, **change}
    if "alias" in change and "version" not in change:
        body.pop("version")
    response = alice_api.post("/api/v1/projects/alpha/endpoints/", body, format="json")
    assert response.status_code == 400, response.content
    assert reason in " ".join(response.json()[field])
    assert not Endpoint.objects.exists()


@pytest.mark.django_db
def test_an_endpoint_goes_on_the_live_cluster_of_its_name_never_a_deleted_one(alice_api, deployable):
    """alice deleted "demo" and made a new "demo": the endpoint is the new one's."""
    from clusters.choices import ClusterStatus
    from clusters.models import Cluster

    from .conftest import provisioned

    Cluster.objects.filter(name="demo").update(status=ClusterStatus.DELETED)
    assert alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": example_spec(cpu=1)},
                          format="json").status_code == 202  # fmt: skip
    provisioned(name="demo", status=ClusterStatus.PROVISIONING)
    live = Cluster.objects.live().get(name="demo")
    response = alice_api.post("/api/v1/projects/alpha/endpoints/", {"name": "chat", "cluster": "demo",
                              "model": deployable, "version": 1}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    assert Endpoint.objects.get().cluster == live
    # The deploy is on the cluster's timeline too.
    assert live.events.filter(message__startswith="Endpoint chat: Created: ").exists()


@pytest.mark.django_db
def test_the_endpoint_pages_say_what_to_do_and_charlie_gets_404(alice, charlie, client, deployable, alice_api):
    client.force_login(alice)
    page = client.get("/endpoints/").content.decode()
    assert "No endpoints yet" in page and "Deploy a model" in page
    response = alice_api.post("/api/v1/projects/alpha/endpoints/", {"name": "chat", "cluster": "demo",
                              "model": deployable, "version": 1}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    page = client.get("/endpoints/alpha/chat/").content.decode()
    assert "No traffic sampled in the last 1h" in page and "/alpha/chat:predict" in page
    refused = client.post("/endpoints/new/", {"project": "alpha", "name": "chat", "cluster": "demo",
                          "model": deployable, "version": "1", "min_replicas": "1", "max_replicas": "1"})  # fmt: skip
    assert refused.status_code == 400 and "already has an endpoint named chat" in refused.content.decode()
    client.force_login(charlie)
    assert client.get("/endpoints/alpha/chat/").status_code == 404
    assert "chat" not in client.get("/endpoints/").content.decode()


FAKE_VLLM = """
import argparse, json
from http.server import BaseHTTPRequestHandler, HTTPServer

parser = argparse.ArgumentParser()
for flag in ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size", "--dtype",
             "--chat-template"):
    parser.add_argument(flag)
args = parser.parse_args()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": args.served_model_name, "tp": args.tensor_parallel_size,
                                     "dtype": args.dtype, "chat_template": args.chat_template}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


HTTPServer((args.host, int(args.port)), Handler).serve_forever()
"""


def test_a_gpu_replica_runs_vllms_openai_server_and_announces_it(tmp_path):
    """vLLM itself needs a GPU; a stand-in module with its command line checks the wrapper: the
    arguments it is given, the wait for /health and the announce file."""
    package = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_VLLM)
    announce = tmp_path / "announce.json"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{settings.BASE_DIR}", "TCC_ADVERTISE_ADDRESS": "127.0.0.1"}
    command = [sys.executable, "-m", "recipes.node.serve", "--model", str(tmp_path), "--served-name", "chat",
               "--version", "big:v3", "--announce", str(announce), "--engine", "vllm", "--gpus", "2"]  # fmt: skip
    replica = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    try:
        wait_until(announce.exists, timeout=60, message="the announce file")
        found = json.loads(announce.read_text())
        assert (found["host"], found["version"]) == ("127.0.0.1", "big:v3")
        with urllib.request.urlopen(f"http://127.0.0.1:{found['port']}/v1/models", timeout=5) as answer:
            [served] = json.loads(answer.read())["data"]
        assert (served["id"], served["tp"], served["dtype"]) == ("chat", "2", "bfloat16")
        # The folder has no chat template: vLLM is given the console's, from the replica's own folder.
        assert Path(served["chat_template"]).read_text() == chat.TEMPLATE
    finally:
        replica.terminate()
        replica.wait(timeout=30)
    # The engine stops with its replica (scancel sends the replica SIGTERM).
    wait_until(lambda: not engines_of(tmp_path), timeout=30, message="the engine to stop with its replica")


def test_a_replica_listens_on_its_nodes_slurm_address_alone(tmp_path):
    """The attack: a replica bound every address of its node, so anything that reached the node (on the
    local backend, the console host's LAN; on gce, a container bridge) reached the port. With --bind node
    (what replica jobs pass) it listens on the address Slurm has for the job's node alone (a stand-in
    scontrol says 127.0.0.2) and announces it; the host's other addresses are refused."""
    from .factories import tiny_model

    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text('#!/bin/sh\necho "NodeName=$4 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.2 '
                                    'NodeHostName=$4 State=IDLE"\n')  # fmt: skip
    (stubs / "scontrol").chmod(0o755)
    announce = tmp_path / "announce.json"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURMD_NODENAME": "cpu-0",
           "PYTHONPATH": str(settings.BASE_DIR)}  # fmt: skip
    model = tiny_model(tmp_path / "model")
    command = [sys.executable, "-m", "recipes.node.serve", "--model", str(model), "--served-name", "chat",
               "--version", "tiny:v1", "--announce", str(announce), "--bind", "node"]  # fmt: skip
    replica = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    try:
        wait_until(announce.exists, timeout=60, message="the announce file")
        found = json.loads(announce.read_text())
        assert found["host"] == "127.0.0.2"
        with urllib.request.urlopen(f"http://127.0.0.2:{found['port']}/health", timeout=5) as answer:
            assert answer.status == 200
        with pytest.raises(OSError):  # ConnectionRefusedError: nothing listens there
            urllib.request.urlopen(f"http://127.0.0.1:{found['port']}/health", timeout=5)
    finally:
        replica.terminate()
        replica.wait(timeout=30)


def engines_of(model_folder):
    return [pid for pid, argv in processes.command_lines() if "vllm.entrypoints.openai.api_server" in argv
            and str(model_folder) in argv]  # fmt: skip


@pytest.mark.django_db
def test_a_gpu_partitions_replica_asks_for_a_gpu_and_runs_vllm(alpha, alice, settings, mlflow_server, tmp_path):
    from clusters import services
    from clusters.spec.reference import build_spec
    from recipes.models import Replica
    from recipes.serving import replica_script

    from .conftest import provisioned

    settings.GCE_REACH_CLUSTERS = False
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    spec = build_spec("a3-ultra", display_name="ultra", zone="us-central1-b", nodes=2, backend="gce")
    cluster = services.create_cluster(project=alpha, name="ultra", spec=spec, user=alice).cluster
    provisioned(pk=cluster.pk)
    version = a_version(alpha, fresh(), tmp_path)
    endpoint = Endpoint.objects.create(project=alpha, cluster=cluster, name="big", model_name=version.name,
                                       version=1)  # fmt: skip
    replica = Replica.objects.create(endpoint=endpoint, version=version, version_ref=version.ref, folder="e/r-1")

    class Runtime:
        python, folder = "/opt/python/bin/python3", "/home/.tcc/runtime"

    script = replica_script(endpoint, replica, "models/x/v1", Runtime)
    assert "#SBATCH --gpus-per-node=1" in script and "--engine vllm --gpus 1" in script
    # Tensor parallel over half an A3 Ultra (8 H200, 224 vCPUs, 2,952 GB): half its CPUs and 90% of half
    # its memory, as Slurm must give them (one CPU and no memory before: vLLM ran short of both).
    checked = services_check(alpha, {"gpus_per_replica": 4}, endpoint)
    assert checked["gpus_per_replica"] == 4
    endpoint.gpus_per_replica = 4
    script = replica_script(endpoint, replica, "models/x/v1", Runtime)
    assert "#SBATCH --gpus-per-node=4" in script and "--engine vllm --gpus 4" in script
    assert "#SBATCH --cpus-per-task=112" in script and f"#SBATCH --mem={int(2952 * 1024 * 0.5 * 0.9)}M" in script
    for wrong, reason in ((3, "must be one of 1, 2, 4, 8"), (16, "at most the 8 GPUs of a node")):
        with pytest.raises(FieldErrors) as refused:
            services_check(alpha, {"gpus_per_replica": wrong}, endpoint)
        assert reason in refused.value.errors["gpus_per_replica"][0]


def services_check(project, data, current):
    from recipes.serving import check

    return check(project, data, current=current)


@pytest.fixture
def scaled(alice_api, deployable, settings):
    """alpha's endpoint "chat" (1 to 3 replicas, 2 in flight per replica, p95 target 500 ms), 10 minutes
    old, with the production timings (30 s window, 60 s cooldown, 300 s idle)."""
    from datetime import timedelta

    from django.utils import timezone

    settings.ENDPOINT_SCALE_WINDOW_SECONDS, settings.ENDPOINT_SCALE_COOLDOWN_SECONDS = 30, 60
    settings.ENDPOINT_SCALE_DOWN_IDLE_SECONDS = 300
    response = alice_api.post("/api/v1/projects/alpha/endpoints/", {"name": "chat", "cluster": "demo",
                              "model": deployable, "version": 1, "min_replicas": 1, "max_replicas": 3,
                              "target_in_flight": 2, "target_p95_ms": 500}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    Endpoint.objects.filter(name="chat").update(created=timezone.now() - timedelta(minutes=10))
    return Endpoint.objects.get(name="chat")


def sampled(endpoint, seconds_ago, **values):
    from datetime import timedelta

    from django.utils import timezone

    from recipes.models import EndpointSample

    fields = {"seconds": 5, "requests": 10, "p50_ms": 40, "p95_ms": 80, "in_flight": 0.5, "replicas": 1, **values}
    EndpointSample.objects.create(endpoint=endpoint, time=timezone.now() - timedelta(seconds=seconds_ago), **fields)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sample", "desired", "reason"),
    [
        ({"in_flight": 3.0}, 2, "Scaled up to 2 replicas: 3.0 requests in flight per replica, over the target 2"),
        ({"p95_ms": 900}, 2, "Scaled up to 2 replicas: p95 latency 900 ms, over the target 500 ms"),
        ({"in_flight": 1.0, "p95_ms": 300}, 1, None),
    ],
)
def test_it_scales_up_on_requests_in_flight_or_a_slow_p95(scaled, sample, desired, reason):
    from django.utils import timezone

    from recipes.serving import autoscale

    for seconds_ago in (5, 10, 15, 20, 25, 30):
        sampled(scaled, seconds_ago - 1, **sample)
    autoscale(scaled, timezone.now())
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == desired
    assert [e.message for e in scaled.events.filter(message__startswith="Scaled")] == ([reason] if reason else [])


@pytest.mark.django_db
def test_it_scales_up_at_once_when_requests_queue_even_in_its_cooldown(scaled):
    """150 concurrent requests on one replica waited p95 4.7 s before the 30 s window's mean added a
    second one. A queue in the router is the burst as it builds: one more replica at the next round."""
    from datetime import timedelta

    from django.utils import timezone

    from recipes.serving import autoscale

    now = timezone.now()
    Endpoint.objects.filter(pk=scaled.pk).update(last_scaled=now - timedelta(seconds=10))  # in its cooldown
    scaled.refresh_from_db()
    sampled(scaled, 1, in_flight=8.0, queued=12)
    autoscale(scaled, now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 2
    assert [e.message for e in scaled.events.filter(message__startswith="Scaled")] == [
        "Scaled up to 2 replicas: 12 requests waited for a free replica"
    ]
    # The second replica is not routed yet (starting): the queue adds no third meanwhile.
    Replica.objects.create(endpoint=scaled, version_ref="x:v1", state=ReplicaState.STARTING)
    sampled(scaled, 0, in_flight=8.0, queued=20)
    autoscale(Endpoint.objects.get(pk=scaled.pk), now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 2
    # An old queue (over two sample intervals ago) is not a burst now.
    scaled.samples.all().delete()
    scaled.replicas.all().delete()
    sampled(scaled, 20, in_flight=0.1, queued=30, replicas=2)
    sampled(scaled, 1, in_flight=0.1, replicas=2)
    autoscale(Endpoint.objects.get(pk=scaled.pk), now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 2


@pytest.mark.django_db
def test_it_waits_out_the_cooldown_and_scales_down_only_when_idle(scaled):
    from datetime import timedelta

    from django.utils import timezone

    from recipes.serving import autoscale

    now = timezone.now()
    Endpoint.objects.filter(pk=scaled.pk).update(desired_replicas=3, last_scaled=now - timedelta(seconds=30))
    scaled.refresh_from_db()
    sampled(scaled, 200, requests=0, in_flight=0, replicas=3)
    autoscale(scaled, now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 3  # in its cooldown
    scaled.last_scaled = now - timedelta(seconds=120)
    sampled(scaled, 100, requests=1, in_flight=0.01, replicas=3)
    autoscale(scaled, now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 3  # a request in the last 300 s
    scaled.events.all().delete()
    scaled.samples.all().delete()
    sampled(scaled, 20, requests=0, in_flight=0, replicas=3)
    autoscale(scaled, now)
    assert Endpoint.objects.get(pk=scaled.pk).desired_replicas == 2
    assert [e.message for e in scaled.events.all()] == ["Scaled down to 2 replicas: no request for 300 s"]


@pytest.mark.django_db
def test_a_replica_is_reached_where_slurm_runs_its_job_never_where_its_announce_file_points(
    scripted, alpha, alice, monkeypatch
):
    """mallory's replica job writes the announce file: a host there would send the router's and the
    console's requests (with their headers) wherever she likes: the cloud's metadata server, the
    console's own services. Only the port is taken from the file; the host is the job's node in Slurm."""
    from clusters import services
    from clusters.models import Cluster
    from clusters.operations import engine
    from clusters.slurm.states import JobStatus
    from recipes.models import ModelVersion
    from recipes.serving import replicas

    from .conftest import scripted_spec

    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    cluster = Cluster.objects.get(name="ok")
    version = ModelVersion.objects.create(project=alpha, name="llama", version=1, family="llama", checkpoint="x",
                                          step=1)  # fmt: skip
    endpoint = Endpoint.objects.create(project=alpha, cluster=cluster, name="chat", model_name="llama", version=1)
    replica = Replica.objects.create(endpoint=endpoint, version=version, version_ref="llama:v1", slurm_job_id=77,
                                     folder="endpoints/x/replica-1")  # fmt: skip
    announce = {"host": "169.254.169.254", "port": 18400, "version": "llama:v1"}
    monkeypatch.setattr(services, "read_file", lambda cluster, path: json.dumps(announce).encode())
    running_on = {"nodes": ""}
    scripted.job_status = lambda cluster, job_id: JobStatus(job_id=job_id, name="serve", user="alice", state="RUNNING",
                                                            partition="cpu", node_count=1, **running_on)  # fmt: skip
    replicas.follow(replica)  # the job has no node yet: nothing is taken from the file
    assert Replica.objects.get(pk=replica.pk).host == ""
    running_on["nodes"] = "cpu-1"
    replicas.follow(replica)
    stored = Replica.objects.get(pk=replica.pk)
    assert (stored.host, stored.port, stored.node) == ("10.9.0.1", 18400, "cpu-1")  # the node tells replicas apart
    for port in (22, 41000):  # no replica's: outside SERVING_REPLICA_PORTS, the range gce's firewall opens
        announce["port"] = port
        stored.host = ""
        stored.save()
        replicas.follow(stored)
        assert Replica.objects.get(pk=replica.pk).host == ""


class Saying(threading.Thread):
    """A stand-in replica whose /health and /metrics answer what `said` holds (path -> body)."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        super().__init__(daemon=True)
        said = self.said = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = said.get(self.path, "").encode()
                self.send_response(200 if self.path in said else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def run(self):
        self.server.serve_forever()


@pytest.mark.django_db
def test_a_draining_replica_keeps_its_requests_until_they_end_or_the_request_timeout_passes(
    scripted, alpha, alice, settings
):
    """A request may run ROUTER_REQUEST_TIMEOUT (120 s); the drain stopped a replica 30 s after it began,
    whatever it was still answering. Now it waits for the replica's own count of requests in flight
    (serve.py's /health, vLLM's /metrics) to reach 0, and never less than the routers need to stop
    sending (two table refreshes and a connect)."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters import services
    from clusters.models import Cluster
    from clusters.operations import engine
    from clusters.slurm.states import JobStatus
    from recipes.models import ModelVersion
    from recipes.serving.replicas import drained

    from .conftest import scripted_spec

    assert settings.ENDPOINT_DRAIN_SECONDS >= settings.ROUTER_REQUEST_TIMEOUT == 120
    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    version = ModelVersion.objects.create(project=alpha, name="llama", version=1, family="llama", checkpoint="x",
                                          step=1)  # fmt: skip
    endpoint = Endpoint.objects.create(project=alpha, cluster=Cluster.objects.get(name="ok"), name="chat",
                                       model_name="llama", version=1)  # fmt: skip
    replica_at = Saying()
    replica_at.start()
    replica = Replica.objects.create(endpoint=endpoint, version=version, version_ref="llama:v1", slurm_job_id=77,
                                     host="127.0.0.1", port=replica_at.port, state=ReplicaState.DRAINING)  # fmt: skip
    running = JobStatus(job_id=77, name="serve", user="alice", state="RUNNING", partition="cpu", node_count=1,
                        nodes="cpu-1")  # fmt: skip
    scripted.job_status = lambda cluster, job_id: running
    now = timezone.now()

    def after(seconds):
        replica.draining_at = now - timedelta(seconds=seconds)
        return drained(replica, now)

    replica_at.said["/health"] = json.dumps({"status": "ok", "in_flight": 0})
    assert after(1) is None  # a router may not have re-read its table yet
    replica_at.said["/health"] = json.dumps({"status": "ok", "in_flight": 1})
    assert after(60) is None  # one request, 60 s into its 120: stopped here before
    replica_at.said["/health"] = json.dumps({"status": "ok", "in_flight": 0})
    assert after(60) == "drained: no request in flight"
    # vLLM: an empty /health, the counts in its Prometheus metrics.
    replica_at.said["/health"] = ""
    replica_at.said["/metrics"] = (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="chat"} 0.0\n'
        'vllm:num_requests_waiting{model_name="chat"} 2.0\n'
    )
    assert after(60) is None
    replica_at.said["/metrics"] = replica_at.said["/metrics"].replace("2.0", "0.0")
    assert after(60) == "drained: no request in flight"
    # Still busy when the request timeout has passed: nothing of the routers' can still be waiting.
    replica_at.said["/metrics"] = replica_at.said["/metrics"].replace("0.0", "3.0")
    assert after(settings.ENDPOINT_DRAIN_SECONDS + 1).startswith("drained: 125 s passed")  # 120 + 2 x 1 + 3
    # Silent, and its job is over: nothing left to wait for.
    replica_at.server.shutdown()
    replica_at.server.server_close()
    assert after(60) is None  # Slurm still runs its job: wait for the timeout
    scripted.job_status = lambda cluster, job_id: None
    assert after(60) == "its job ended while draining"


def submitting(monkeypatch):
    """Replicas 'submitted' by the reconcile as rows only (no Slurm), with the folder they were given."""
    started = []

    def start(endpoint, version, staged):
        started.append(Replica.objects.create(endpoint=endpoint, version=version, version_ref=version.ref,
                                              slurm_job_id=100 + len(started), folder=staged))  # fmt: skip
        return started[-1]

    monkeypatch.setattr(sys.modules["recipes.serving.reconcile"], "start", start)  # the module, not its function
    return started


@pytest.mark.django_db
def test_a_version_is_staged_by_an_operation_of_its_own_never_inside_the_reconcile(scripted, alpha, alice, monkeypatch):
    """Copying a model of many GB inside the periodic reconcile ran past that task's time limit and aborted
    the round for every endpoint. Now the reconcile starts a STAGE operation (heartbeats, resumed by the
    engine) and starts replicas once it succeeded; a failed one fails the roll with its error."""
    from django.utils import timezone

    from clusters import services
    from clusters.choices import OperationStatus
    from clusters.models import Cluster, Operation
    from clusters.operations import engine
    from console.errors import Conflict
    from recipes.models import ModelVersion
    from recipes.registry import STAGE, staged_path
    from recipes.serving import change_endpoint, reconcile

    from .conftest import scripted_spec

    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    cluster = Cluster.objects.get(name="ok")
    v1, v2 = (ModelVersion.objects.create(project=alpha, name="llama", version=n, family="llama", checkpoint="x",
                                          step=n) for n in (1, 2))  # fmt: skip
    copied = []

    def stage(version, cluster):
        if version == v2:
            raise Conflict("llama:v2's artifact in the registry has no config.json")
        copied.append(version.ref)
        return staged_path(version)

    monkeypatch.setattr("recipes.registry.staging.stage", stage)
    started = submitting(monkeypatch)
    endpoint = Endpoint.objects.create(project=alpha, cluster=cluster, name="chat", model_name="llama", version=1,
                                       created_by=alice)  # fmt: skip

    def rounds(n):
        for _ in range(n):
            reconcile(Endpoint.objects.get(pk=endpoint.pk))
        return Endpoint.objects.get(pk=endpoint.pk)

    rounds(3)
    [staging] = Operation.objects.filter(cluster=cluster, kind=STAGE)
    assert staging.status == OperationStatus.PENDING and staging.params["version"] == "llama:v1"
    assert (copied, started) == ([], [])  # the reconcile copies nothing and starts nothing meanwhile
    engine.run(staging.pk)  # a worker runs it
    assert Operation.objects.get(pk=staging.pk).status == OperationStatus.SUCCEEDED and copied == ["llama:v1"]
    rounds(1)
    assert [r.folder for r in started] == [staged_path(v1)]
    assert any(m.startswith("Staging llama:v1 onto ok") for m in events(endpoint))
    # A second endpoint of the same version uses the same copy.
    other = Endpoint.objects.create(project=alpha, cluster=cluster, name="other", model_name="llama", version=1)
    reconcile(other)
    assert Operation.objects.filter(kind=STAGE).count() == 1 and len(started) == 2

    # v2 cannot be staged: the roll fails with the operation's error, once, and v1 serves throughout.
    serving = Saying()
    serving.said["/health"] = json.dumps({"status": "ok", "in_flight": 0})
    serving.start()
    Replica.objects.filter(pk=started[0].pk).update(state=ReplicaState.READY, ready_at=timezone.now(),
                                                    host="127.0.0.1", port=serving.port)  # fmt: skip
    change_endpoint(Endpoint.objects.get(pk=endpoint.pk), {"version": 2}, user=alice)
    rounds(2)
    assert Replica.objects.get(pk=started[0].pk).state == ReplicaState.READY  # not drained for a v2 not there yet
    staging = Operation.objects.filter(kind=STAGE).latest("created")
    assert staging.params["version"] == "llama:v2"
    engine.run(staging.pk)
    failed = rounds(2)
    assert failed.status == EndpointStatus.FAILED and failed.failed_version == v2
    assert failed.failure == "staging it failed: llama:v2's artifact in the registry has no config.json"
    assert Replica.objects.get(pk=started[0].pk).state == ReplicaState.READY
    assert Operation.objects.filter(kind=STAGE).count() == 2 and len(started) == 2


@pytest.mark.django_db
def test_a_roll_whose_new_replica_never_serves_fails_keeps_the_old_serving_and_waits_to_be_told(
    scripted, alpha, alice, alice_api, monkeypatch, client
):
    """v2's replica dies before it serves (a bad checkpoint, an engine that cannot load it): the roll
    stops there, v1 keeps serving, and nothing is tried again until alice says so. Before, every
    reconcile round (5 s) submitted another v2 replica that failed the same way, for ever."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters import services
    from clusters.models import Cluster
    from clusters.operations import engine
    from clusters.slurm.states import JobStatus
    from console.errors import ConsoleError
    from recipes.models import ModelVersion
    from recipes.serving import change_endpoint, reconcile

    from .conftest import scripted_spec

    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    v1, v2 = (ModelVersion.objects.create(project=alpha, name="llama", version=n, family="llama", checkpoint="x",
                                          step=n) for n in (1, 2))  # fmt: skip
    endpoint = Endpoint.objects.create(project=alpha, cluster=Cluster.objects.get(name="ok"), name="chat",
                                       model_name="llama", version=2, serving=v1,
                                       status=EndpointStatus.READY)  # fmt: skip
    serving = Saying()
    serving.said["/health"] = json.dumps({"status": "ok", "in_flight": 0})
    serving.start()
    old = Replica.objects.create(endpoint=endpoint, version=v1, version_ref=v1.ref, slurm_job_id=77, host="127.0.0.1",
                                 port=serving.port, state=ReplicaState.READY, ready_at=timezone.now())  # fmt: skip
    started = submitting(monkeypatch)
    monkeypatch.setattr(sys.modules["recipes.serving.reconcile"], "staged_for", lambda endpoint, want: "models/x")
    monkeypatch.setattr(services, "read_file", lambda cluster, path: (_ for _ in ()).throw(ConsoleError("no file")))
    running = JobStatus(job_id=77, name="serve", user="alice", state="RUNNING", partition="cpu", node_count=1,
                        nodes="cpu-1")  # fmt: skip
    scripted.job_status = lambda cluster, job_id: running if job_id == 77 else None  # v2's jobs have ended

    def rounds(n):
        for _ in range(n):
            reconcile(Endpoint.objects.get(pk=endpoint.pk))
        return Endpoint.objects.get(pk=endpoint.pk)

    assert rounds(1).status == EndpointStatus.ROLLING and len(started) == 1
    failed = rounds(5)
    assert len(started) == 1  # one replica of v2, not one more every round
    assert failed.status == EndpointStatus.FAILED and failed.failed_version == v2
    assert failed.failure == f"replica {started[0].pk}: its job ended before it served"
    assert Replica.objects.get(pk=old.pk).state == ReplicaState.READY  # v1 still serves
    assert any(m.startswith("Roll to llama:v2 failed") and "llama:v1 still serves" in m for m in events(endpoint))
    shown = alice_api.get("/api/v1/projects/alpha/endpoints/chat/").json()
    assert shown["status"] == "FAILED" and shown["failure"] == {"version": "llama:v2", "reason": failed.failure}
    client.force_login(alice)
    page = client.get("/endpoints/alpha/chat/").content.decode()
    assert 'id="roll-failure"' in page and "Retry llama:v2" in page

    # alice retries (an empty change, the page's Retry): one new replica; not serving in time fails it again.
    change_endpoint(failed, {}, user=alice)
    assert rounds(1).status == EndpointStatus.ROLLING and len(started) == 2
    assert any(m.endswith("trying llama:v2 again") for m in events(endpoint))
    Replica.objects.filter(pk=started[1].pk).update(created=timezone.now() - timedelta(seconds=2401))
    scripted.job_status = lambda cluster, job_id: running  # queued or loading, but never serving
    again = rounds(2)
    assert again.status == EndpointStatus.FAILED and len(started) == 2
    assert again.failure == f"replica {started[1].pk}: not serving 2400 s after it was submitted"
    assert Replica.objects.get(pk=old.pk).state == ReplicaState.READY


@pytest.mark.django_db
def test_a_roll_onto_a_full_cluster_drains_an_old_replica_for_each_new_one_ready(
    scripted, alpha, alice, monkeypatch, client
):
    """CI: the endpoint scaled up to 2 while rolling onto a two-node cluster; v2's first replica was ready,
    its second waited in Slurm for the node v1's replica held, and v1 was drained only once both v2
    replicas were ready: never. Now each new replica ready lets one old one go, and as many serve as
    before the roll at every step."""
    from django.utils import timezone

    from clusters import services
    from clusters.models import Cluster
    from clusters.operations import engine
    from clusters.slurm.states import JobStatus
    from console.errors import ConsoleError
    from recipes.models import ModelVersion
    from recipes.serving import reconcile

    from .conftest import scripted_spec

    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    v1, v2 = (ModelVersion.objects.create(project=alpha, name="llama", version=n, family="llama", checkpoint="x",
                                          step=n) for n in (1, 2))  # fmt: skip
    serving = Saying()
    serving.said["/health"] = json.dumps({"status": "ok", "in_flight": 0})
    serving.start()
    started = submitting(monkeypatch)
    monkeypatch.setattr(sys.modules["recipes.serving.reconcile"], "staged_for", lambda endpoint, want: "models/x")
    # No announce file: a new replica waits in Slurm's queue until marked ready below.
    monkeypatch.setattr(services, "read_file", lambda cluster, path: (_ for _ in ()).throw(ConsoleError("no file")))
    running = JobStatus(job_id=1, name="serve", user="alice", state="RUNNING", partition="cpu", node_count=1,
                        nodes="cpu-0")  # fmt: skip
    scripted.job_status = lambda cluster, job_id: running

    def rolled(old_replicas, desired):
        Endpoint.objects.all().delete()
        endpoint = Endpoint.objects.create(project=alpha, cluster=Cluster.objects.get(name="ok"), name="chat",
                                           model_name="llama", version=2, serving=v1, status=EndpointStatus.READY,
                                           min_replicas=1, max_replicas=desired, desired_replicas=desired)  # fmt: skip
        for n in range(old_replicas):
            Replica.objects.create(endpoint=endpoint, version=v1, version_ref=v1.ref, slurm_job_id=70 + n,
                                   host="127.0.0.1", port=serving.port, state=ReplicaState.READY,
                                   ready_at=timezone.now())  # fmt: skip
        started.clear()
        reconcile(Endpoint.objects.get(pk=endpoint.pk))
        assert len(started) == desired and all(r.version == v2 for r in started)
        return endpoint

    def ready(replica):
        Replica.objects.filter(pk=replica.pk).update(state=ReplicaState.READY, ready_at=timezone.now(),
                                                     host="127.0.0.1", port=serving.port)  # fmt: skip

    def serving_now(endpoint):
        reconcile(Endpoint.objects.get(pk=endpoint.pk))
        return sorted(r.version_ref for r in endpoint.replicas.filter(state=ReplicaState.READY))

    # CI's case: one v1 replica, two v2 wanted, the second cannot start until v1's node is free.
    endpoint = rolled(old_replicas=1, desired=2)
    assert serving_now(endpoint) == ["llama:v1"]  # nothing of v2 serves yet: v1 stays
    ready(started[0])
    assert serving_now(endpoint) == ["llama:v2"]
    assert any(m.endswith("draining: replaced by llama:v2") for m in events(endpoint))

    # Two of v1, two of v2 wanted: one goes as each new one is ready, two serve throughout.
    endpoint = rolled(old_replicas=2, desired=2)
    ready(started[0])
    assert serving_now(endpoint) == ["llama:v1", "llama:v2"]
    assert serving_now(endpoint) == ["llama:v1", "llama:v2"]  # and stays so while the second starts
    # The page shows the roll's progress: one new ready of two, one old serving, one draining.
    client.force_login(alice)
    page = client.get("/endpoints/alpha/chat/live/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="roll"' in page and 'aria-valuenow="25"' in page
    assert "1 of 2 new replicas ready · 1 old serving, 1 draining" in page
    shown = api_client_for(alice).get("/api/v1/projects/alpha/endpoints/chat/").json()
    assert shown["roll"] == {"to": "llama:v2", "ready": 1, "wanted": 2, "old": 1, "draining": 1, "percent": 25}
    ready(started[1])
    assert serving_now(endpoint) == ["llama:v2", "llama:v2"]
    Replica.objects.filter(endpoint=endpoint, state=ReplicaState.DRAINING).update(state=ReplicaState.STOPPED)
    assert 'id="roll"' not in client.get("/endpoints/alpha/chat/").content.decode()  # over
    serving.server.shutdown()
    serving.server.server_close()


@pytest.mark.django_db
def test_each_endpoint_gets_a_round_of_its_own_and_two_never_drive_it_at_once(scripted, alpha, alice, monkeypatch,
                                                                              settings, redis_broker):  # fmt: skip
    """One task reconciled every endpoint in turn: a slow one (probes of 2 s per replica) held up the rest
    past the 5 s interval, and a change's reconcile could run beside the periodic one, each starting the
    replica the endpoint lacked. Now the periodic task fans out one round per endpoint, and a lease keeps a
    second round off an endpoint being driven. A round waits however late (it expired at the next interval:
    a worker steadily behind dropped every one) and no second one is sent while it waits."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters import services
    from clusters.models import Cluster
    from clusters.operations import engine
    from recipes import tasks
    from recipes.models import ModelVersion
    from recipes.serving import reconcile_one

    from .conftest import scripted_spec

    engine.run(services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice).pk)
    ModelVersion.objects.create(project=alpha, name="llama", version=1, family="llama", checkpoint="x", step=1)
    cluster = Cluster.objects.get(name="ok")
    chat, other = (Endpoint.objects.create(project=alpha, cluster=cluster, name=n, model_name="llama", version=1)
                   for n in ("chat", "other"))  # fmt: skip
    started = submitting(monkeypatch)
    monkeypatch.setattr(sys.modules["recipes.serving.reconcile"], "staged_for", lambda endpoint, want: "models/x")
    sent = []
    monkeypatch.setattr(tasks.reconcile_endpoint, "apply_async", lambda args, expires: sent.append((args, expires)))
    tasks.reconcile_endpoints()
    timeout = settings.PERIODIC_ROUND_TIMEOUT
    assert timeout > 10 * settings.ENDPOINT_RECONCILE_SECONDS
    assert sorted(sent) == [((chat.pk,), timeout), ((other.pk,), timeout)]
    sent.clear()
    tasks.reconcile_endpoints()  # the next beat, both rounds still waiting: nothing piles up
    assert sent == []
    monkeypatch.setattr(sys.modules["recipes.tasks"], "reconcile_one", lambda endpoint_id: None)
    tasks.reconcile_endpoint(chat.pk)  # chat's round started
    tasks.reconcile_endpoints()
    assert sent == [((chat.pk,), timeout)]
    purge_queue(redis_broker)

    Endpoint.objects.filter(pk=chat.pk).update(reconciling_until=timezone.now() + timedelta(seconds=60))
    assert reconcile_one(chat.pk) is False and started == []  # another worker holds it
    Endpoint.objects.filter(pk=chat.pk).update(reconciling_until=timezone.now() - timedelta(seconds=1))
    assert reconcile_one(chat.pk) is True and len(started) == 1  # a lease that ran out (a dead worker's)
    assert Endpoint.objects.get(pk=chat.pk).reconciling_until is None  # released at the end


def test_a_fine_tuned_model_is_asked_in_exactly_the_form_it_was_trained_on(tmp_path):
    """SFT trained on "### Question: ...\\n### Answer: " after BOS; the CPU replica asked chat requests as
    "user: ...\\nassistant:" with no BOS, so a fine-tuned model answered a prompt it had never seen. One
    template (recipes/node/chat.py, saved in every export's tokenizer) now renders both, and vLLM too."""
    from recipes.node import serve, train

    from .factories import tiny_model

    folder = tiny_model(tmp_path / "model")
    model = serve.Model(folder, "chat", "tiny:v1")
    messages = [{"role": "user", "content": "Name a colour"}]
    asked = serve.chat_prompt(model, messages)
    trained = train.sft_prompt(train.ByteTokenizer(), "Name a colour")
    assert asked.ids == trained == train.sft_prompt(train.FolderTokenizer(folder), "Name a colour")
    assert trained == [train.ByteTokenizer.bos, *b"### Question: Name a colour\n### Answer: "]
    assert (folder / "chat_template.jinja").read_text() == chat.TEMPLATE  # what transformers saves
    assert serve.chat_template_file(folder, tmp_path) is None  # vLLM reads the folder's own


def test_a_replica_counts_its_requests_in_flight_on_its_health(monkeypatch):
    from http.server import ThreadingHTTPServer

    from recipes.node import serve

    release = threading.Event()

    class Blocking:
        name, version = "chat", "tiny:v1"

        def complete(self, prompt, options):
            release.wait(20)
            return "ok", "stop", {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}

    server = ThreadingHTTPServer(("127.0.0.1", 0), serve.handler_for(Blocking()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    health = lambda: json.loads(urllib.request.urlopen(f"{base}/health", timeout=5).read())["in_flight"]  # noqa: E731
    assert health() == 0
    asking = threading.Thread(target=call, args=(base, "/v1/completions", {"prompt": "hi"}), daemon=True)
    asking.start()
    wait_until(lambda: health() == 1, timeout=10, message="the request in flight")
    release.set()
    asking.join(10)
    assert health() == 0
    server.shutdown()


def test_a_replica_queues_a_burst_of_new_connections_and_drops_none():
    """Routers starting, health checks beside requests: a burst of new connections while the replica's
    accept loop is busy. Python's default backlog of 5 had the kernel drop the SYNs beyond it, each
    retried 1 s later: a second of latency from nothing but the burst."""
    from http.server import BaseHTTPRequestHandler

    from recipes.node import serve

    server = serve.listening("127.0.0.1", "", BaseHTTPRequestHandler)  # listening; nothing accepts yet
    try:
        assert connected_in_a_burst(server.server_address[:2]) == 40
    finally:
        server.server_close()


def test_a_stream_of_made_up_tokens_costs_one_lookup_each_and_never_the_routers_memory(settings, monkeypatch):
    import asyncio
    import secrets

    from recipes.serving import router as routing

    settings.ROUTER_TOKEN_CACHE_SIZE, settings.ROUTER_TOKEN_CACHE_SECONDS = 50, 60
    router = routing.Router()
    lookups = []
    good = "tcc_alice"

    def check_token(raw):
        lookups.append(raw)
        return (1, {7}) if raw == good else None

    monkeypatch.setattr(router, "check_token", check_token)

    class Request:
        def __init__(self, raw):
            self.headers = {"Authorization": f"Bearer {raw}"}

    async def attack():
        assert await router.token(Request(good)) == (1, {7})
        for _ in range(2000):
            assert await router.token(Request(secrets.token_hex(16))) is None
        assert await router.token(Request(good)) == (1, {7})

    asyncio.run(attack())
    assert len(router.tokens) == 50  # bounded, oldest out
    assert len(lookups) == 2002 and lookups.count(good) == 2  # alice's entry was pushed out, then looked up again
