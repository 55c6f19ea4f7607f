"""Recipes: the catalog, launch validation, and tiny runs on one shared 2-node cluster: local, and gce
booted by the fake Compute API, with the same assertions (a few tests look at this machine's own
processes and files, which a local cluster has and a gce one keeps on its VMs: those are local's).

rita owns project "rlab" with cluster "train" (2 CPU nodes), made once for each backend; charlie is
an outsider.
"""

import contextlib
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from clusters import processes
from clusters.models import Operation
from clusters.operations import engine
from recipes.catalog import recipes
from recipes.models import ModelVersion, Run, RunStatus

from .conftest import BACKENDS, api_client_for, module_cluster, submit_through_slurmrestd, synced, wait_until

pytestmark = pytest.mark.django_db
RUNS = "/api/v1/projects/rlab/clusters/train/runs/"


@pytest.fixture(scope="module", params=BACKENDS)
def train_cluster(request, django_db_setup, django_db_blocker, slurm):
    with module_cluster(django_db_blocker, username="rita", project_slug="rlab", request=request) as cluster:
        yield cluster
        from recipes.runs import tensorboard

        tensorboard.stop(cluster)
        with django_db_blocker.unblock():
            ModelVersion.objects.all().delete()
            Run.objects.all().delete()


@pytest.fixture
def rita_api(train_cluster):
    return api_client_for(train_cluster.project.members.get())


class Launched:
    """A launch the API accepted (202, the run SUBMITTING with its LAUNCH operation), after that operation
    ran here as a worker would run it: json() is the run as the API then shows it."""

    status_code = 202

    def __init__(self, api, accepted):
        self.api, self.accepted = api, accepted

    def json(self):
        return self.api.get(f"{RUNS}{self.accepted['id']}/").json()


def launch(api, **body):
    response = api.post(
        RUNS, {"recipe": "llama3.1-8b-pretrain", "profile": "tiny", "nodes": 2, "steps": 30, **body}, format="json"
    )
    if response.status_code != 202:
        return response
    accepted = response.json()
    assert accepted["status"] == "SUBMITTING" and accepted["slurm_job_id"] is None, accepted
    assert accepted["launch"]["kind"] == "LAUNCH" and response["Location"].endswith(f"/runs/{accepted['id']}/")
    engine.run(Operation.objects.get(uuid=accepted["launch"]["id"]).pk)
    return Launched(api, accepted)


def status_after_sync(api, run_id):
    """The run as the API shows it after one round of the Slurm sync (what Celery beat would run)."""
    synced(Run.objects.get(uuid=run_id).cluster)
    return api.get(f"{RUNS}{run_id}/").json()


def finished(api, run_id, timeout=240):
    def done():
        body = status_after_sync(api, run_id)
        return body if body["status"] in ("COMPLETED", "FAILED", "CANCELLED") else None

    return wait_until(done, timeout=timeout, interval=1, message=f"run {run_id} to finish")


def in_home(body, *parts):
    """A path of the run's folder relative to the cluster's shared home."""
    return "/".join(["runs", Path(body["work_dir"]).name, *parts])


def read(body, *parts):
    """A file of the run, as the console reads it: through the cluster agent ("" while it is missing)."""
    from clusters import services

    cluster, path = Run.objects.get(uuid=body["id"]).cluster, in_home(body, *parts)
    return services.read_file(cluster, path).decode() if services.file_exists(cluster, path) else ""


def losses(body):
    return [json.loads(line) for line in read(body, "metrics.jsonl").splitlines()]


def local_only(cluster, why):
    if cluster.backend != "local":
        pytest.skip(f"local only: {why}")


def test_the_catalog_has_llama_and_gemma_recipes_of_every_kind():
    catalog = recipes()
    sizes = {(r["family"], r["size"]) for r in catalog.values()}
    assert {
        ("llama", "8B"),
        ("llama", "70B"),
        ("llama", "405B"),
        ("gemma", "2B"),
        ("gemma", "9B"),
        ("gemma", "27B"),
    } <= sizes
    assert {"pretrain", "cpt", "sft", "rl"} <= {r["kind"] for r in catalog.values()}
    for recipe in catalog.values():
        assert recipe["profiles"]["tiny"]["nodes"] >= 1
        assert recipe["profiles"]["full"]["gpus_per_node"] == recipe["hardware"]["gpus_per_node"]


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"recipe": "llama9-1t"}, "recipe", "unknown recipe"),
        ({"profile": "full"}, "profile", "needs 8 GPUs per node; partition 'cpu' has 0"),
        ({"nodes": 3}, "nodes", "partition 'cpu' has 2 nodes"),
        ({"steps": -5}, "steps", "must be at least 1"),
        ({"partition": "gpu"}, "partition", "no partition 'gpu'"),
        ({"recipe": "llama3.1-8b-cpt"}, "init_from", "a registered model (name:vN or name@alias)"),
        ({"register_as": "Not A Name"}, "register_as", "must be 1-63 lowercase letters, digits or hyphens"),
        ({"register": "maybe"}, "register", "must be true or false"),
        ({"alias": "Prod Uction"}, "alias", "an alias is lowercase letters"),
        ({"alias": "production", "register": "false"}, "alias", "this run does not register"),
        ({"stall_minutes": "0"}, "stall_minutes", "from 1 to 1440"),
        ({"recipe": "llama3.1-8b-sft"}, "init_from", "fine-tuning starts from a run of this project"),
        ({"recipe": "llama3.1-8b-grpo", "nodes": 1}, "init_from", "RL starts from a run of this project"),
        ({"nodes": 1, "dataset": "/etc/passwd"}, "dataset", "a .jsonl or .parquet file"),
        ({"nodes": 1, "dataset": "data/missing.jsonl"}, "dataset", "there is no data/missing.jsonl"),
        ({"nodes": 1, "dataset": "data/corpus"}, "dataset", "there is no data/corpus/index.json"),
    ],
)
def test_it_refuses_a_bad_launch_with_field_reasons_and_submits_nothing(rita_api, body, field, reason):
    response = launch(rita_api, **body)
    assert response.status_code == 400
    assert reason in " ".join(response.json()[field])
    assert not Run.objects.exists()


def test_a_launch_from_a_deleted_clusters_run_whose_checkpoint_the_registry_lacks_says_why(train_cluster, rita_api):
    from clusters.choices import ClusterStatus
    from clusters.models import Cluster

    gone = Cluster.objects.create(project=train_cluster.project, name="gone", spec={}, status=ClusterStatus.DELETED)
    old = Run.objects.create(cluster=gone, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                             nodes=1, steps=6, config={}, script="", work_dir="/gone/runs/x",
                             status=RunStatus.COMPLETED)  # fmt: skip
    before = Run.objects.count()
    response = launch(rita_api, recipe="llama3.1-8b-cpt", init_from=str(old.uuid), steps=1)
    assert response.status_code == 400
    assert "were on cluster gone (deleted), and the registry keeps none of them" in response.json()["init_from"][0]
    old.archive = {"skipped": "step 6's checkpoint is 9.0 GiB, over the 4.0 GiB the console copies", "final": True}
    old.save()
    response = launch(rita_api, recipe="llama3.1-8b-cpt", init_from=str(old.uuid), steps=1)
    assert "over the 4.0 GiB the console copies" in response.json()["init_from"][0]
    # Another project's run, its checkpoint kept or not, is no run of this project's.
    from clusters.models import Project

    elsewhere = Project.objects.create(slug="elsewhere", name="Elsewhere")
    gone.project = elsewhere
    gone.save()
    old.archive = {"step": 6, "bytes": 1000, "final": True}
    old.save()
    response = launch(rita_api, recipe="llama3.1-8b-cpt", init_from=str(old.uuid), steps=1)
    assert "starts from a run of this project" in response.json()["init_from"][0]
    assert Run.objects.count() == before


def test_charlie_cannot_launch_on_ritas_cluster_nor_see_its_tensorboard(train_cluster, charlie_api, client, charlie):
    assert launch(charlie_api).status_code == 404
    assert charlie_api.get(RUNS).status_code == 404
    client.force_login(charlie)
    assert client.get("/clusters/rlab/train/tensorboard/data/runs").status_code == 404


def test_it_trains_tiny_llama_on_two_nodes_continues_it_and_fine_tunes(rita_api, client, train_cluster, mlflow_server):
    response = launch(rita_api, steps=30)
    assert response.status_code == 202, response.content
    run = response.json()
    assert "#SBATCH --nodes=2" in run["script"] and "srun" in run["script"]
    done = finished(rita_api, run["id"])
    assert done["status"] == "COMPLETED", Run.objects.get(uuid=run["id"]).log_tail
    rows = losses(done)
    assert rows[-1]["step"] == 30
    assert rows[-1]["loss"] < rows[0]["loss"] * 0.7  # it learns
    # 2 nodes x 2 ranks: a 2x2 mesh (FSDP2 x tensor parallel), sharded DCP checkpoints.
    assert json.loads(read(done, "checkpoints/step-30/meta.json"))["world"] == 4
    assert json.loads(read(done, "result.json"))["tensor"] == 2
    from clusters import services
    from clusters.accounts import account_for

    folder = in_home(done, "checkpoints/step-30")
    assert set(services.list_files(train_cluster, folder, "rng-*.pt")) == {f"rng-{r}.pt" for r in range(4)}
    assert set(services.list_files(train_cluster, folder, "*.distcp")) == {f"__{r}_0.distcp" for r in range(4)}
    # It ran as rita's own account, not root: the checkpoint is that account's.
    account = account_for(train_cluster.project.members.get(), train_cluster.project)
    assert services.files.agent_call(train_cluster, "stat", f"{folder}/meta.json")["owner"] == account.name

    # The run page draws the loss and shows the log; its live part stops polling once done.
    client.force_login(train_cluster.project.members.get())
    page = client.get(f"/clusters/rlab/train/runs/{run['id']}/").content.decode()
    assert 'id="loss-chart"' in page
    assert "[train] step 30" in page
    assert "4 ranks: 2 data-parallel (FSDP2) x 2 tensor-parallel" in page
    assert "(no GPU: the tiny profile trains on CPU)" in page and " MB</td>" in page  # estimate beside the peak
    assert client.get(f"/clusters/rlab/train/runs/{run['id']}/live/", HTTP_HX_REQUEST="true").status_code == 286
    # The whole log as a download, through the cluster agent (the page shows its tail).
    download = client.get(f"/clusters/rlab/train/runs/{run['id']}/log/")
    assert download.status_code == 200 and download["Content-Disposition"].startswith("attachment;")
    whole = b"".join(download.streaming_content).decode()
    assert all(f"[train] step {step} " in whole for step in (10, 20, 30))

    # TensorBoard answers with the run's scalars through the console, and only to signed-in members.
    tags = client.get("/clusters/rlab/train/tensorboard/data/plugin/scalars/tags").json()
    assert "train/loss" in tags[f"{run['id']}/tensorboard"]
    scalars = client.get(
        "/clusters/rlab/train/tensorboard/data/plugin/scalars/scalars",
        {"run": f"{run['id']}/tensorboard", "tag": "train/loss"},
    ).json()
    assert len(scalars) == 30
    client.logout()
    assert client.get("/clusters/rlab/train/tensorboard/data/runs")["Location"].startswith("/accounts/login/")

    # Register it (its exported model goes into the registry's store); continued pretraining starts
    # from that model version, copied onto the cluster, at its step.
    name = f"llama-tiny-{train_cluster.backend}"  # the session's MLflow server outlives the module
    registered = rita_api.post(f"{RUNS}{run['id']}/register/", {"name": name}, format="json")
    assert registered.status_code == 201, registered.content
    assert registered.json()["version"] == 1 and registered.json()["step"] == 30
    assert registered.json()["artifact"].startswith("mlflow-artifacts:/")
    assert rita_api.get("/api/v1/projects/rlab/models/").json()[0]["name"] == name
    response = launch(rita_api, recipe="llama3.1-8b-cpt", steps=10, init_from=f"{name}:v1")
    assert response.status_code == 202, response.content
    assert json.loads(read(response.json(), "config.json"))["init_from_hf"].endswith(f"models/rlab.{name}/v1")
    cpt = finished(rita_api, response.json()["id"])
    assert cpt["status"] == "COMPLETED", cpt
    cpt_rows = losses(cpt)
    assert cpt_rows[0]["step"] == 31 and cpt_rows[-1]["step"] == 40
    assert cpt_rows[0]["loss"] < rows[0]["loss"] * 0.7  # it starts from trained weights

    # A Gemma checkpoint cannot continue a Llama run.
    gemma = Run.objects.get(uuid=run["id"])
    gemma.recipe_id = "gemma2-2b-pretrain"
    gemma.save()
    response = launch(rita_api, recipe="llama3.1-8b-cpt", init_from=run["id"], steps=1)
    assert response.status_code == 400
    assert "is a gemma model; this recipe trains llama" in response.json()["init_from"][0]
    gemma.recipe_id = "llama3.1-8b-pretrain"
    gemma.save()

    # SFT on the shipped instruction set from the registered version (loss on responses only): it starts
    # from trained weights, far below a random model's first loss, at step 1 of its own.
    alias = rita_api.put(f"/api/v1/projects/rlab/models/{name}/aliases/production/", {"version": 1}, format="json")
    assert alias.status_code == 200, alias.content
    response = launch(rita_api, recipe="llama3.1-8b-sft", steps=15, init_from=f"{name}@production")
    assert response.status_code == 202, response.content
    sft = finished(rita_api, response.json()["id"])
    assert sft["status"] == "COMPLETED", sft
    sft_rows = losses(sft)
    assert sft_rows[0]["step"] == 1 and sft_rows[-1]["step"] == 15
    assert sft_rows[0]["loss"] < rows[0]["loss"] * 0.7

    # RL launches, stages its model and reads its files as SFT does just above, so on gce the test ends
    # here (about 30 s saved); the recipes' learning is the same on both backends.
    if train_cluster.backend != "local":
        return

    # RL: DPO with TRL on the shipped preference set; the policy learns to prefer the chosen answers.
    response = launch(rita_api, recipe="llama3.1-8b-dpo", nodes=1, steps=12, init_from=f"{name}:v1")
    assert response.status_code == 202, response.content
    dpo = finished(rita_api, response.json()["id"])
    assert dpo["status"] == "COMPLETED", dpo
    dpo_rows = losses(dpo)
    assert dpo_rows[-1]["step"] == 12
    assert dpo_rows[-1]["reward_margin"] > 0

    # Online RL: GRPO samples answers and the recipe's verifiable reward scores them.
    response = launch(rita_api, recipe="llama3.1-8b-grpo", nodes=1, steps=8, init_from=f"{name}:v1")
    assert response.status_code == 202, response.content
    grpo = finished(rita_api, response.json()["id"])
    assert grpo["status"] == "COMPLETED", grpo
    assert [row["step"] for row in losses(grpo)] == list(range(1, 9))
    assert all(0 <= row["reward"] <= 1 for row in losses(grpo))


def test_cancelling_a_run_cancels_its_slurm_job(rita_api, train_cluster):
    from clusters.backends import get_backend

    run = launch(rita_api, steps=100000).json()
    wait_until(lambda: status_after_sync(rita_api, run["id"])["status"] == "RUNNING", message="the run to start")
    response = rita_api.post(f"{RUNS}{run['id']}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    backend = get_backend(train_cluster.backend)
    wait_until(lambda: getattr(backend.job_status(train_cluster, run["slurm_job_id"]), "state", None) == "CANCELLED",
               timeout=30, message="Slurm to say the job was cancelled")  # fmt: skip
    assert Run.objects.get(uuid=run["id"]).status == RunStatus.CANCELLED
    assert rita_api.post(f"{RUNS}{run['id']}/cancel/").status_code == 409


class WorkerKilled(BaseException):
    """The worker process dying (not an error the engine handles): the operation stays RUNNING."""


def test_a_launch_resumed_after_its_worker_died_past_the_submit_does_not_submit_again(
    rita_api, train_cluster, monkeypatch
):
    from clusters import services

    real_submit = services.submit_batch

    def submit_then_die(*args, **kwargs):
        real_submit(*args, **kwargs)  # Slurm has the job; the worker dies before it stores the id
        raise WorkerKilled

    monkeypatch.setattr(services, "submit_batch", submit_then_die)
    accepted = rita_api.post(RUNS, {"recipe": "llama3.1-8b-pretrain", "steps": 100000}, format="json").json()
    operation = Operation.objects.get(uuid=accepted["launch"]["id"])
    with pytest.raises(WorkerKilled):
        engine.run(operation.pk)
    run = Run.objects.get(uuid=accepted["id"])
    assert run.status == RunStatus.SUBMITTING and run.slurm_job_id is None
    monkeypatch.setattr(services, "submit_batch", real_submit)

    engine.run(operation.pk, stale_after=0)  # another worker takes the silent operation over

    run.refresh_from_db()
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED" and operation.attempts == 2, operation.error
    jobs = services.jobs_named(train_cluster, f"llama3.1-8b-pretrain-{str(run.uuid)[:8]}")
    assert [job.job_id for job in jobs] == [run.slurm_job_id]
    assert run.status == RunStatus.QUEUED
    assert rita_api.post(f"{RUNS}{run.uuid}/cancel/").status_code == 200


SLURM_REST = "/v1beta1/projects/rlab/locations/us-central1/modelDevelopmentClusters/train:callSlurmRestApi"


def cluster_home(cluster):
    """Where jobs sent through slurmrestd write: the cluster's own home. Not /tmp, where a
    slurm-<id>.out left by an older cluster's job of the same id (and another owner) fails the job."""
    from clusters.backends import get_backend

    return str(get_backend(cluster.backend).shared_dir(cluster))


def run_in_home(api, home, name, script):
    """`script` as a job of the api's user through :callSlurmRestApi, in a folder `name` it makes in
    `home`; waits for the script's last line (it touches done.txt) and returns that folder."""
    script = f"#!/bin/bash\nmkdir {name} && cd {name} || exit 1\n" + script + "touch done.txt\n"
    submit_through_slurmrestd(api, SLURM_REST, script, name=name, nodes=1, tasks=1, current_working_directory=str(home))
    wait_until(lambda: (home / name / "done.txt").exists(), timeout=60, message=f"the {name} job")
    return home / name


def test_automation_submits_lists_and_cancels_jobs_through_slurmrestd(rita_api, train_cluster):
    submit = {
        "method": "HTTP_METHOD_POST",
        "path": "/slurm/v0.0.38/job/submit",
        "body": {
            "script": "#!/bin/bash\nsleep 60\n",
            "job": {
                "name": "from-rest",
                "partition": "cpu",
                "nodes": 1,
                "tasks": 1,
                "time_limit": 5,
                "current_working_directory": cluster_home(train_cluster),
                "environment": {"PATH": "/usr/bin:/bin"},
            },
        },
    }
    response = rita_api.post(SLURM_REST, submit, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status_code"] == 200
    job_id = response.json()["body"]["job_id"]
    jobs = rita_api.post(SLURM_REST, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"}, format="json").json()
    assert job_id in [job["job_id"] for job in jobs["body"]["jobs"]]
    cancelled = rita_api.post(
        SLURM_REST, {"method": "HTTP_METHOD_DELETE", "path": f"/slurm/v0.0.38/job/{job_id}"}, format="json"
    )
    assert cancelled.json()["status_code"] == 200

    def state():
        job = rita_api.post(
            SLURM_REST, {"method": "HTTP_METHOD_GET", "path": f"/slurm/v0.0.38/job/{job_id}"}, format="json"
        )
        return job.json()["body"]["jobs"][0]["job_state"]

    # scancel passes through COMPLETING while the job's processes are killed.
    wait_until(lambda: state() != "COMPLETING", timeout=30, message="the cancel to finish")
    assert state() == "CANCELLED"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"method": "HTTP_METHOD_PATCH", "path": "/slurm/v0.0.38/jobs"}, "method"),
        ({"method": "HTTP_METHOD_GET", "path": "/etc/passwd"}, "path"),
        ({"method": "HTTP_METHOD_GET", "path": "/slurm/../../etc"}, "path"),
    ],
)
def test_it_refuses_a_slurmrestd_call_it_does_not_forward(rita_api, body, field):
    response = rita_api.post(SLURM_REST, body, format="json")
    assert response.status_code == 400
    violations = response.json()["error"]["details"][0]["fieldViolations"]
    assert [v["field"] for v in violations] == [field]


def test_charlie_cannot_call_ritas_slurmrestd(train_cluster, charlie_api):
    response = charlie_api.post(SLURM_REST, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"}, format="json")
    assert response.status_code == 403


def test_a_run_whose_job_fails_shows_its_failing_lines_and_exit_code(rita_api, client, train_cluster):
    import os
    import signal

    local_only(train_cluster, "it kills the training process on this machine")
    run = launch(rita_api, steps=100000, nodes=1).json()
    metrics = Path(run["work_dir"]) / "metrics.jsonl"
    wait_until(metrics.exists, message="the run to log a step")
    # The training process dies (as on a hardware fault): srun reports it and the job fails.
    config = str(Path(run["work_dir"]) / "config.json")
    trainers = [pid for pid, argv in processes.command_lines() if config in argv and "srun" not in Path(argv[0]).name]
    assert trainers
    for pid in trainers:
        os.kill(pid, signal.SIGKILL)
    done = finished(rita_api, run["id"], timeout=60)
    assert done["status"] == "FAILED", done
    assert done["exit_code"] not in (None, 0)
    assert "exit code" in done["error"]
    client.force_login(train_cluster.project.members.get())
    page = client.get(f"/clusters/rlab/train/runs/{run['id']}/").content.decode()
    assert "Killed" in page or "killed" in page  # srun's own line about the task
    assert "exit code" in page


def test_no_munge_key_jwt_or_token_reaches_a_page_an_answer_or_a_log_line(rita_api, train_cluster, client, caplog):
    import base64

    from clusters.backends import get_backend

    from .factories import exchange, leaks

    local_only(train_cluster, "it reads the keys from the cluster's folder (gce: tests/test_gce_boot.py)")
    caplog.set_level("DEBUG")
    paths = get_backend("local").paths(train_cluster)
    munge, jwt = paths.munge_key.read_bytes(), paths.jwt_key.read_bytes()
    secrets = {
        f"{name} ({form})": encoded
        for name, key in (("munge key", munge), ("JWT key", jwt))
        for form, encoded in (
            ("hex", key.hex()),
            ("base64", base64.b64encode(key).decode()),
            ("text", key.decode("latin-1")[:24]),
        )
    }
    texts = []
    for body in (
        {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/nodes"},
        {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/diag"},
        {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/job/999999"},
    ):
        response, text = exchange(rita_api, "post", SLURM_REST, data=body, format="json")
        assert response.status_code == 200
        texts.append(text)
    client.force_login(train_cluster.project.members.get())
    for path in ("/clusters/rlab/train/", "/clusters/rlab/train/nodes/", "/clusters/rlab/train/jobs/",
                 "/clusters/rlab/train/health/", "/clusters/rlab/train/runs/"):  # fmt: skip
        response, text = exchange(client, "get", path)
        assert response.status_code == 200, path
        texts.append(text)
    for path in ("", "nodes/", "jobs/", "events/", "scans/"):
        texts.append(exchange(rita_api, "get", f"/api/v1/projects/rlab/clusters/train/{path}")[1])
    texts.append(caplog.text)
    assert leaks(texts, secrets) == set()


def test_a_job_sent_through_slurmrestd_runs_as_the_callers_account_and_other_projects_cannot_read_it(
    rita_api, train_cluster, django_user_model
):
    import subprocess

    from clusters.accounts import account_for
    from clusters.backends import get_backend
    from clusters.models import Project

    local_only(train_cluster, "it reads the home and runs commands as the accounts on this machine")
    rita = train_cluster.project.members.get()
    mine = account_for(rita, train_cluster.project)
    home = get_backend("local").paths(train_cluster).jobs
    script = "#!/bin/bash\nid -un > whoami.txt\nid -u >> whoami.txt\n"
    job_id = submit_through_slurmrestd(
        rita_api, SLURM_REST, script, name="whoami", nodes=1, tasks=1, current_working_directory=str(home)
    )["job_id"]
    job = lambda: rita_api.post(  # noqa: E731
        SLURM_REST, {"method": "HTTP_METHOD_GET", "path": f"/slurm/v0.0.38/job/{job_id}"}, format="json"
    ).json()["body"]["jobs"][0]
    wait_until(lambda: job()["job_state"] == "COMPLETED", timeout=60, message="the whoami job")
    assert job()["user_name"] == mine.name
    name, uid = (home / "whoami.txt").read_text().split()
    assert name == mine.name and uid != "0"
    assert home.stat().st_mode & 0o7777 == 0o3770
    # An account of another project cannot read this project's cluster home.
    outsider = django_user_model.objects.create_user("olaf", "olaf@example.com", "olaf-password")
    elsewhere = Project.objects.create(slug="olab", name="olab")
    theirs = account_for(outsider, elsewhere)
    other_home = home.parent / "other-home"
    other_home.mkdir(exist_ok=True)
    get_backend("local").ensure_account(train_cluster, theirs)  # makes the account (home: rita's cluster)
    get_backend("local").ensure_account(train_cluster, mine)  # and hands the home back to rita's group
    peek = subprocess.run(["runuser", "-u", theirs.name, "--", "cat", str(home / "whoami.txt")], capture_output=True)
    assert peek.returncode != 0 and b"Permission denied" in peek.stderr
    own = subprocess.run(["runuser", "-u", mine.name, "--", "cat", str(home / "whoami.txt")], capture_output=True)
    assert own.returncode == 0 and own.stdout.split()[0].decode() == mine.name


def test_ritas_job_cannot_read_the_consoles_database_keys_or_registry_on_its_host(rita_api, train_cluster):
    """The local backend runs users' jobs on the console's own host: rita's job tries the files the
    console keeps (the database with every project's sessions, password hashes and tokens, the
    secret key, the registry's store). Each is refused by the folder's mode (0700), not by luck."""
    from django.conf import settings

    from clusters.backends import get_backend

    local_only(train_cluster, "it reads the files of this machine's console")
    database = Path(settings.DATABASES["default"]["NAME"])
    files = [database, Path(settings.VAR_DIR) / "secret_key"]
    folders = [database.parent, Path(settings.VAR_DIR), Path(settings.MLFLOW_DIR)]
    assert database.exists()
    tries = [f"cat {f} >/dev/null" for f in files] + [f"ls {d} >/dev/null" for d in folders]
    script = "".join(f"{t} 2>>peek.txt; echo $? >>codes.txt\n" for t in tries)
    home = run_in_home(rita_api, get_backend("local").paths(train_cluster).jobs, "peek", script)
    assert (home / "codes.txt").read_text().split() == ["1", "1", "2", "2", "2"]  # every cat and ls failed
    assert (home / "peek.txt").read_text().count("Permission denied") == len(tries)
    assert Path(settings.VAR_DIR).stat().st_mode & 0o777 == 0o700


def test_ritas_job_cannot_move_the_consoles_folder_aside_to_plant_code_root_runs(rita_api, train_cluster):
    """Root runs the console's code from .tcc/ in the shared home on every node (health scans, the
    epilog's GPU check). rita's job renames .tcc/ to make her own in its place: the home's sticky bit
    refuses (before it was 2770 without it, the rename worked and the next scan ran her code as root)."""
    from clusters.backends import get_backend

    local_only(train_cluster, "it reads the local cluster's home")
    shared = get_backend("local").paths(train_cluster).jobs
    assert (shared / ".tcc").is_dir() and (shared / ".tcc").stat().st_uid == 0
    script = "mv ../.tcc ../.tcc-moved 2>move.txt; echo $? >codes.txt\n"
    home = run_in_home(rita_api, shared, "mover", script)
    assert (home / "codes.txt").read_text().split() == ["1"]
    assert "Operation not permitted" in (home / "move.txt").read_text()
    assert (shared / ".tcc").is_dir() and not (shared / ".tcc-moved").exists()


def test_ritas_job_cannot_queue_a_celery_task_on_the_consoles_redis(rita_api, train_cluster, redis_broker):
    """A task queued on the console's broker runs in a worker as root. rita's job on the console's host
    finds Redis on 127.0.0.1 and tries it: without the password every command is refused, the password
    file is root's alone, and no process's command line shows it."""
    from django.conf import settings

    from clusters.backends import get_backend

    local_only(train_cluster, "it talks to this machine's Redis")
    port = redis_broker.connection_pool.connection_kwargs["port"]
    planted = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-planted"
    script = (
        f"redis-cli -p {port} -n 15 lpush {planted} task >redis.txt 2>&1\n"
        f"cat {settings.REDIS_PASSWORD_FILE} >/dev/null 2>peek.txt; echo $? >codes.txt\n"
        "ps -eo args >processes.txt\n"
    )
    home = run_in_home(rita_api, get_backend("local").paths(train_cluster).jobs, "planter", script)
    assert "NOAUTH" in (home / "redis.txt").read_text()
    assert redis_broker.llen(planted) == 0
    assert (home / "codes.txt").read_text().split() == ["1"] and "Permission denied" in (home / "peek.txt").read_text()
    password = settings.REDIS_PASSWORD_FILE.read_text().strip()
    assert len(password) >= 32 and password not in (home / "processes.txt").read_text()


def test_ritas_job_cannot_use_the_registry_without_the_consoles_credentials(rita_api, train_cluster, mlflow_server):
    """The registry (MLflow) listens on 127.0.0.1 of the console's host, where rita's job runs: she tries
    to list every project's models and to move a production alias. MLflow's basic-auth app answers
    401 to both; only the console holds the password (its folder is 0700)."""
    from django.conf import settings

    from clusters.backends import get_backend

    local_only(train_cluster, "it talks to this machine's MLflow server")
    api = f"{mlflow_server}/api/2.0/mlflow/registered-models"
    alias = '{"name": "alpha.llama", "alias": "production", "version": "1"}'
    status = "curl -s -o /dev/null -w '%{http_code}\\n'"
    script = (
        f"{status} '{api}/search' >answers.txt\n"
        f"{status} -X POST -H 'Content-Type: application/json' -d '{alias}' '{api}/alias' >>answers.txt\n"
        f"cat {settings.MLFLOW_PASSWORD_FILE} >/dev/null 2>peek.txt; echo $? >>answers.txt\n"
    )
    home = run_in_home(rita_api, get_backend("local").paths(train_cluster).jobs, "alias-mover", script)
    assert (home / "answers.txt").read_text().split() == ["401", "401", "1"]
    assert "Permission denied" in (home / "peek.txt").read_text()


def test_an_account_of_another_project_cannot_submit_to_ritas_cluster(train_cluster, rita_api):
    """Every project's accounts live on the local backend's one machine. olaf's (project olab) takes
    rita's cluster's slurm.conf and submits: munged's socket is in a folder only rlab's group enters,
    and every partition admits rlab's group alone. rita's own account submits the same way."""
    import grp
    import subprocess

    from django.conf import settings

    from clusters.accounts import account_for, project_group
    from clusters.backends import get_backend

    local_only(train_cluster, "it submits as accounts of this machine")
    paths = get_backend("local").paths(train_cluster)
    group = project_group(train_cluster.project)
    olaf, olab = f"{settings.POSIX_ACCOUNT_PREFIX}olaf-0", f"{settings.POSIX_ACCOUNT_PREFIX}p-olab-0"
    subprocess.run(["groupadd", "--system", olab], capture_output=True, check=False)
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", olab, olaf],
                   capture_output=True, check=False)  # fmt: skip

    def submit(account):
        return subprocess.run(
            ["runuser", "-u", account, "--", "env", f"SLURM_CONF={paths.conf}", "sbatch", "--partition=cpu",
             "--output=/dev/null", "--wrap=true"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    theirs = submit(olaf)
    assert theirs.returncode != 0 and "Submitted batch job" not in theirs.stdout
    assert "Permission denied" in theirs.stderr, theirs.stderr  # munged's socket, before Slurm hears of it
    munge = paths.munge_dir.stat()
    assert (munge.st_mode & 0o777, munge.st_gid) == (0o750, grp.getgrnam(group).gr_gid)
    assert f"AllowGroups={group}" in paths.conf.read_text()
    rita = account_for(train_cluster.project.members.get(), train_cluster.project)
    get_backend("local").ensure_account(train_cluster, rita)
    mine = submit(rita.name)
    assert mine.returncode == 0 and "Submitted batch job" in mine.stdout, mine.stderr


def test_a_member_who_leaves_loses_their_jobs_and_the_projects_files_on_its_clusters(train_cluster, django_user_model):
    """bob leaves rlab with a job still running on its cluster. The console let him in no more, but on
    the cluster his account stayed in rlab's group: his job ran on, reading and writing the project's
    home, and he could submit more with the cluster's slurm.conf. Removing him starts a LEAVE operation
    that takes the account out of the group and cancels his jobs."""
    import subprocess

    from clusters import services
    from clusters.accounts import account_for
    from clusters.backends import get_backend
    from clusters.choices import OperationStatus
    from clusters.models import Operation
    from clusters.operations import engine

    local_only(train_cluster, "it runs commands as the accounts on this machine")
    project = train_cluster.project
    paths = get_backend("local").paths(train_cluster)
    home = services.shared_dir(train_cluster)
    django_user_model.objects.create_user("bob", "bob@example.com", "bob-password")
    services.members.set_role(project, "bob", "operator")
    bob = account_for(django_user_model.objects.get(username="bob"), project)
    get_backend("local").ensure_account(train_cluster, bob)

    def as_bob(*command):
        return subprocess.run(["runuser", "-u", bob.name, "--", "env", f"SLURM_CONF={paths.conf}", *command],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    try:
        submitted = as_bob("sbatch", "--partition=cpu", "--output=/dev/null", "--wrap=sleep 600")
        assert submitted.returncode == 0, submitted.stderr
        job_id = int(submitted.stdout.split()[-1])
        assert as_bob("ls", home).returncode == 0  # a member reads the project's home

        services.members.remove(project, "bob")
        leave = Operation.objects.get(cluster=train_cluster, kind="LEAVE")
        engine.run(leave.pk)  # as a worker runs it
        assert Operation.objects.get(pk=leave.pk).status == OperationStatus.SUCCEEDED, leave.error

        def state():
            job = services.job_status(train_cluster, job_id)
            return job.state if job else "GONE"

        wait_until(lambda: state() in ("CANCELLED", "GONE"), timeout=60, message="bob's job to be cancelled")
        refused = as_bob("ls", home)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
        again = as_bob("sbatch", "--partition=cpu", "--output=/dev/null", "--wrap=true")
        assert again.returncode != 0 and "Submitted batch job" not in again.stdout
        assert any(e.message.startswith("bob left project rlab") for e in train_cluster.events.all())

        # Back in the project, his account is in the group again.
        services.members.set_role(project, "bob", "operator")
        get_backend("local").ensure_account(train_cluster, bob)
        assert as_bob("ls", home).returncode == 0
    finally:
        if project.memberships.filter(user__username="bob").exists():
            services.members.remove(project, "bob")
            for operation in Operation.objects.filter(cluster=train_cluster, kind="LEAVE", status="PENDING"):
                engine.run(operation.pk)


def test_the_launch_page_shows_the_layout_and_the_memory_estimate_before_submit(train_cluster, client):
    client.force_login(train_cluster.project.members.get())
    form = {"recipe": "gemma2-2b-pretrain", "profile": "tiny", "partition": "cpu", "nodes": "2", "steps": "5",
            "init_from": "", "dataset": ""}  # fmt: skip
    page = client.post("/clusters/rlab/train/runs/new/", form).content.decode()
    assert "2 nodes x 2 ranks: 2 data-parallel (FSDP2) x 2 tensor-parallel" in page
    assert "memory per rank, estimated:" in page and "(no GPU: trains on CPU)" in page
    assert "#SBATCH --ntasks-per-node=2" in page and "--gpus-per-node" not in page
    assert not Run.objects.exists()  # a preview submits nothing
    refused = client.post("/clusters/rlab/train/runs/new/", {**form, "nodes": "1", "dataset": "none.csv"})
    assert refused.status_code == 400 and "a .jsonl or .parquet file" in refused.content.decode()


def test_sft_starts_from_a_hugging_face_folder_in_the_shared_home(rita_api, train_cluster, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from clusters import services
    from recipes.node.train import hf_tokenizer

    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 260, "max_position_embeddings": 128}  # fmt: skip
    LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(tmp_path)
    hf_tokenizer().save_pretrained(tmp_path)
    for path in tmp_path.iterdir():  # as a user would copy a folder onto the cluster's storage
        services.write_file(train_cluster, f"models/tiny-llama/{path.name}", path.read_bytes(), mode=0o644)

    for init_from, reason in (
        ("hf:models/none", "there is no models/none/config.json"),
        ("hf:runs", "there is no runs/config.json"),
    ):
        refused = launch(rita_api, recipe="llama3.1-8b-sft", init_from=init_from, steps=2)
        assert refused.status_code == 400 and reason in refused.json()["init_from"][0]
    response = launch(rita_api, recipe="llama3.1-8b-sft", init_from="hf:models/tiny-llama", steps=3)
    assert response.status_code == 202, response.content
    run = finished(rita_api, response.json()["id"])
    assert run["status"] == "COMPLETED", Run.objects.get(uuid=run["id"]).log_tail
    assert run["layout"]["tensor"] == 2 and run["layout"]["ranks"] == 4
    config = json.loads(read(run, "config.json"))
    assert config["model"]["hidden_size"] == 32 and config["init_from_hf"].endswith("/models/tiny-llama")
    kept = json.loads(read(run, "checkpoints/step-3/config.json"))  # the folder's architecture, not the recipe's
    assert (kept["hidden_size"], kept["num_hidden_layers"]) == (32, 2)


def test_deleting_the_cluster_leaves_no_job_tensorboard_or_reservation_behind(rita_api, train_cluster, client):
    """The module's last test: it deletes the module's cluster."""
    import pwd

    from clusters.backends import get_backend

    local_only(train_cluster, "it looks for leftover processes on this machine (gce: tests/test_gce_boot.py)")
    backend = get_backend("local")
    paths = backend.paths(train_cluster)
    client.force_login(train_cluster.project.members.get())
    assert client.get("/clusters/rlab/train/tensorboard/").status_code == 200  # starts TensorBoard
    job = {
        "script": "#!/bin/bash\nsleep 600\n",
        "job": {
            "name": "long",
            "partition": "cpu",
            "nodes": 1,
            "current_working_directory": cluster_home(train_cluster),
            "environment": {"PATH": "/usr/bin:/bin"},
        },
    }
    submit = {"method": "HTTP_METHOD_POST", "path": "/slurm/v0.0.38/job/submit", "body": job}
    sent = rita_api.post(SLURM_REST, submit, format="json")
    job_id = sent.json()["body"]["job_id"]
    wait_until(lambda: processes.job_processes(str(paths.conf)), timeout=60, message=f"job {job_id}'s processes to run")
    backend.hold(train_cluster, "tcc-hold-leftover", ["cpu-1"])
    assert "tcc-hold-leftover" in backend.slurm(train_cluster).reservations()
    tensorboard = [
        pid
        for pid, argv in processes.command_lines()
        if any(arg.startswith("# tcc-tensorboard") for arg in argv) and str(paths.root) in " ".join(argv)
    ]  # fmt: skip (TensorBoard, not the agent that starts it)
    assert tensorboard
    # It parses event files users' jobs wrote: never as root.
    nobody = pwd.getpwnam("nobody").pw_uid
    assert {Path(f"/proc/{pid}").stat().st_uid for pid in tensorboard} == {nobody}
    # The attack: another project's job on this machine reads rlab's runs from TensorBoard's port (it listened
    # on 127.0.0.1 with no login), or takes the port while it is free. It has no TCP port now, and its Unix
    # socket's folder is nobody's alone: another account cannot even reach the socket.
    assert all(listening_tcp_ports(pid) == set() for pid in tensorboard)
    folder = paths.root / "tensorboard"
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (nobody, 0o700)
    probe = (
        "import socket, sys\nconnection = socket.socket(socket.AF_UNIX)\n"
        "try: connection.connect(sys.argv[1])\nexcept OSError as exc: print(exc.errno)"
    )
    stranger = subprocess.run(["/usr/bin/python3", "-c", probe, str(folder / "tb.sock")], user="daemon",
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    assert stranger.stdout.strip() == str(errno.EACCES), stranger

    response = rita_api.delete("/api/v1/projects/rlab/clusters/train/")
    assert response.status_code == 202, response.content
    engine.run(Operation.objects.get(uuid=response.json()["id"]).pk)

    root, conf = str(paths.root), str(paths.conf)
    assert not paths.root.exists()
    still = [pid for pid, argv in processes.command_lines() if any(root in arg for arg in argv)]
    still += [pid for pid, _ in processes.command_lines() if processes.environ(pid).get("SLURM_CONF") == conf]
    assert still == []
    assert not processes.job_processes(conf)


def listening_tcp_ports(pid):
    """The TCP ports process `pid` listens on (its sockets' inodes matched in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
