"""Helpers more than one test module uses (fixtures live in conftest.py): model versions for the registry
and endpoint tests, the secret-leak check, the v1beta1 create, and waits on operations and local nodes.
Test modules import these, never each other."""

import contextlib
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from django.conf import settings

from clusters import processes
from clusters.backends import get_backend
from clusters.models import Operation
from recipes import registry

from .conftest import wait_until


def fresh(prefix="llama"):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def train_on_ranks(folder, ranks=1):
    """recipes/node/train.py on folder/config.json as the nodes run it: one process, or `ranks` gloo ranks
    under torchrun on this machine. The run's result.json (None when the run exports no result)."""
    command = [sys.executable, "-m", "recipes.node.train", str(folder / "config.json")]
    if ranks > 1:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
                   "--standalone", "-m", "recipes.node.train", str(folder / "config.json")]  # fmt: skip
    done = subprocess.run(command, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=300)
    (folder / "run.log").write_text(done.stdout + done.stderr)  # what the job's slurm-N.out would hold
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = folder / "result.json"
    return json.loads(result.read_text()) if result.exists() else None


def losses(folder):
    """The loss of every step a run wrote to metrics.jsonl."""
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def tiny_model(folder):
    """A tiny Llama in Hugging Face format, as a run's export writes it."""
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from recipes.node.train import hf_tokenizer

    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 260, "max_position_embeddings": 128}  # fmt: skip
    LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(folder)
    hf_tokenizer().save_pretrained(folder)
    (folder / "tcc.json").write_text(json.dumps({"step": 3}))
    return folder


def a_version(project, name, tmp_path, losses=(3.0, 2.0, 1.5), parent=None, lr="0.001"):
    """A version as register_run makes one (an MLflow run with metrics, params and the model's files),
    from a folder on this machine instead of a cluster."""
    from mlflow.entities import Metric, Param

    mlflow = registry.client()
    run_id = mlflow.create_run(registry.experiment_id(mlflow, project)).info.run_id
    metrics = [Metric("loss", value, 0, step) for step, value in enumerate(losses, 1)]
    mlflow.log_batch(run_id, metrics=metrics, params=[Param("lr", lr), Param("recipe", "llama3.1-8b-pretrain")])
    folder = tiny_model(tmp_path / uuid.uuid4().hex)
    mlflow.log_artifacts(run_id, str(folder), "model")
    source = f"{mlflow.get_run(run_id).info.artifact_uri}/model"
    return registry.publish(project, name, source, run_id=run_id, family="llama", step=len(losses),
                            final_loss=losses[-1], lineage={"parent": parent})  # fmt: skip


def leaks(texts, secrets):
    """The secrets (name -> value) found in any of `texts`, and any JWT (they start "eyJ")."""
    found = {name for name, value in secrets.items() for text in texts if value and value in text}
    return found | {"a JWT" for text in texts if "eyJhbGciOi" in text or "eyJ0eXAiOi" in text}


def exchange(client, method, path, **kwargs):
    response = getattr(client, method)(path, **kwargs)
    headers = "\n".join(f"{k}: {v}" for k, v in response.items())
    return response, f"{headers}\n{response.content.decode(errors='replace')}"


BASE = "/v1beta1/projects/alpha/locations/us-central1"

SERVICE_EXAMPLE = Path(settings.BASE_DIR) / "examples" / "service-create-a3ultra.json"


def service_example():
    return json.loads(SERVICE_EXAMPLE.read_text())


def create(client, cluster_id="a3u", body=None, location="us-central1"):
    return client.post(
        f"/v1beta1/projects/alpha/locations/{location}/modelDevelopmentClusters?model_development_cluster_id={cluster_id}",
        body or service_example(),
        format="json",
    )


def finished(operation_id, timeout=120):
    def done():
        operation = Operation.objects.get(uuid=operation_id)
        return operation if operation.is_done else None

    return wait_until(done, timeout=timeout, message=f"operation {operation_id}")


def idle_nodes(cluster):
    return sorted(s.name for s in get_backend("local").node_statuses(cluster) if s.state == "idle" and not s.flags)


def slurmd_pids(cluster, node):
    return processes.find_pids("slurmd", str(get_backend("local").paths(cluster).conf), node)


def call(base, path, body=None, token=None, raw=None):
    """(status, JSON answer) of one request to `base` (a router, a replica): POST with a body, else GET."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"{base}{path}", data=data, method="POST" if data is not None else "GET")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def start_step_by_step(page, live_server, cluster_id="steps"):
    page.goto(f"{live_server.url}/clusters/wizard/")
    form = page.locator("#scratch-form")
    form.get_by_label("Cluster id").fill(cluster_id)
    form.get_by_role("button", name="Start").click()
    page.wait_for_url(f"**/clusters/alpha/{cluster_id}/wizard/basics/")


def free_port():
    """A port on 127.0.0.1 nothing listens on (bound, then let go: a connection there is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connected_in_a_burst(address, count=40, wait=0.5):
    """How many of `count` connections to a listening `address` open within `wait` seconds each while
    nothing accepts them (a server busy a moment): the kernel queues as many as the listen backlog and
    drops the SYNs of the rest, which a client retries only 1 s later (then 3, 7, ... s)."""
    opened = []
    try:
        for _ in range(count):
            with contextlib.suppress(TimeoutError):
                opened.append(socket.create_connection(address, timeout=wait))
        return len(opened)
    finally:
        for connection in opened:
            connection.close()
