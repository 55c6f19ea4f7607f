"""The model registry on a real MLflow server: versions, aliases, lineage, pages and REST, and (at the
end, on a real local Slurm cluster with a real Celery worker) runs that register themselves and
versions that outlive their cluster.

alice and bob run project "alpha"; charlie is an outsider. The MLflow server lives for the session,
so each test names its models afresh.
"""

import pytest
from django.test import override_settings

from recipes import registry
from recipes.models import ModelVersion

from .factories import a_version, fresh

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(alpha, mlflow_server, tmp_path):
    """alpha's model with two versions, v2 trained from v1."""
    name = fresh()
    v1 = a_version(alpha, name, tmp_path)
    v2 = a_version(alpha, name, tmp_path, losses=(1.4, 1.2, 1.1), parent=v1, lr="0.0005")
    return name, v1, v2


def test_it_numbers_versions_as_mlflow_does_and_keeps_their_lineage(alpha, model):
    name, v1, v2 = model
    assert (v1.version, v2.version) == (1, 2)
    found = registry.client().get_model_version(f"alpha.{name}", "2")
    assert found.tags["tcc.parent"] == f"{name}:v1" and found.source == v2.checkpoint
    assert registry.metric_history(v2)["loss"] == [(1, 1.4), (2, 1.2), (3, 1.1)]


def test_an_alias_names_one_version_and_moves_in_one_step(alpha, alice_api, model):
    name, v1, _ = model
    url = f"/api/v1/projects/alpha/models/{name}/aliases/production/"
    assert alice_api.put(url, {"version": 1}, format="json").status_code == 200
    assert registry.resolve(alpha, f"{name}@production") == v1
    moved = alice_api.put(url, {"version": 2}, format="json")
    assert moved.status_code == 200 and moved.json()["version"] == 2
    assert registry.aliases(alpha, name) == {"production": 2}  # one version per alias
    assert registry.client().get_model_version_by_alias(f"alpha.{name}", "production").version == "2"
    body = alice_api.get(f"/api/v1/projects/alpha/models/{name}/").json()
    assert body["aliases"] == {"production": 2} and [v["version"] for v in body["versions"]] == [2, 1]
    assert body["versions"][0]["parent"] == f"{name}:v1"
    assert alice_api.delete(url).status_code == 204
    assert registry.aliases(alpha, name) == {}


def test_alice_sees_the_models_page_a_version_with_its_lineage_and_a_comparison(alpha, alice, client, model):
    name, _, _ = model
    registry.set_alias(alpha, name, "staging", 2)
    client.force_login(alice)
    listing = client.get("/models/").content.decode()
    assert f'href="/models/alpha/{name}/"' in listing
    assert name in client.get("/models/", {"q": name[-6:]}).content.decode()
    assert "No model matches" in client.get("/models/", {"q": "no-such"}).content.decode()
    page = client.get(f"/models/alpha/{name}/").content.decode()
    assert f"<code>{name}@staging</code>" in page and 'id="versions"' in page
    version = client.get(f"/models/alpha/{name}/v2/").content.decode()
    assert f'href="/models/alpha/{name}/v1/">{name}:v1</a>' in version  # lineage: its parent, a link
    assert 'id="loss-chart"' in version and "0.0005" in version and "staging" in version
    compared = client.get(f"/models/alpha/{name}/compare/", {"a": 1, "b": 2}).content.decode()
    assert 'id="loss-chart"' in compared  # both versions' curves on one chart
    assert f"{name}:v1: " in compared and f"{name}:v2: " in compared  # in its summary, one series each
    assert "<td><code>0.001</code></td><td><code>0.0005</code></td>" in compared


def test_the_models_page_says_what_to_do_when_there_is_none(alpha, alice, client):
    client.force_login(alice)
    page = client.get("/models/").content.decode()
    assert "No registered models yet" in page and "registers its model here by itself" in page


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"version": 9}, "version", "has no version 9"),
        ({}, "version", "must be a version number"),
        ({"version": "two"}, "version", "must be a version number"),
    ],
)
def test_a_bad_alias_gets_a_400_naming_the_field_and_changes_nothing(alpha, alice_api, model, body, field, reason):
    name, _, _ = model
    registry.set_alias(alpha, name, "production", 1)
    response = alice_api.put(f"/api/v1/projects/alpha/models/{name}/aliases/production/", body, format="json")
    assert response.status_code == 400 and reason in response.json()[field][0]
    assert registry.aliases(alpha, name) == {"production": 1}


def test_an_alias_cannot_name_another_models_version(alpha, alice_api, model, tmp_path):
    name, _, _ = model
    other = fresh("gemma")
    for _ in range(3):
        a_version(alpha, other, tmp_path)
    response = alice_api.put(f"/api/v1/projects/alpha/models/{name}/aliases/production/", {"version": 3},
                             format="json")  # fmt: skip
    assert response.status_code == 400 and f"{name} has no version 3" in response.json()["version"][0]
    bad = alice_api.put(f"/api/v1/projects/alpha/models/{name}/aliases/latest/", {"version": 1}, format="json")
    assert bad.status_code == 400 and "'latest' is MLflow's own" in bad.json()["alias"][0]
    gone = alice_api.delete(f"/api/v1/projects/alpha/models/{name}/aliases/staging/")
    assert gone.status_code == 400 and "has no alias staging" in gone.json()["alias"][0]
    assert registry.aliases(alpha, name) == {} and registry.aliases(alpha, other) == {}


def test_deleting_a_version_removes_it_from_mlflow_and_its_alias_with_it(alpha, alice_api, model):
    name, v1, _ = model
    registry.set_alias(alpha, name, "production", 1)
    assert alice_api.delete(f"/api/v1/projects/alpha/models/{name}/versions/1/").status_code == 204
    assert not ModelVersion.objects.filter(pk=v1.pk).exists()
    assert [v.version for v in registry.client().search_model_versions(f"name='alpha.{name}'")] == ["2"]
    assert registry.aliases(alpha, name) == {}
    assert alice_api.get(f"/api/v1/projects/alpha/models/{name}/versions/1/").status_code == 404


def test_charlie_gets_404_on_alphas_model_its_versions_and_aliases(model, charlie_api, charlie, client):
    name, _, _ = model
    base = f"/api/v1/projects/alpha/models/{name}/"
    assert charlie_api.get(base).status_code == 404
    assert charlie_api.get(f"{base}versions/1/").status_code == 404
    assert charlie_api.put(f"{base}aliases/production/", {"version": 1}, format="json").status_code == 404
    assert charlie_api.delete(f"{base}versions/1/").status_code == 404
    client.force_login(charlie)
    assert client.get(f"/models/alpha/{name}/").status_code == 404
    assert client.get(f"/models/alpha/{name}/v1/").status_code == 404
    assert name not in client.get("/models/").content.decode()
    assert client.post(f"/models/alpha/{name}/v1/delete/").status_code == 404
    assert ModelVersion.objects.filter(name=name).count() == 2


def test_a_silent_registry_is_a_clear_503_and_a_warning_on_the_page(alpha, alice, alice_api, client, model):
    name, _, _ = model
    with override_settings(MLFLOW_TRACKING_URI="http://127.0.0.1:9"):
        response = alice_api.get(f"/api/v1/projects/alpha/models/{name}/")
        assert response.status_code == 503 and "model registry" in response.json()["detail"]
        client.force_login(alice)
        page = client.get(f"/models/alpha/{name}/")
        assert page.status_code == 200 and "the model registry is not answering" in page.content.decode()


def test_a_launch_from_an_unknown_version_or_alias_is_refused_with_the_reason(alpha, model):
    from console.errors import FieldErrors

    name, _, _ = model
    for ref in (f"{name}:v7", f"{name}@canary", "nothing:v1"):
        with pytest.raises(FieldErrors) as refused:
            registry.resolve(alpha, ref)
        assert f"no registered model version {ref}" in refused.value.errors["init_from"][0]


def test_a_kept_checkpoint_that_a_newer_one_replaced_leaves_the_registry(alpha, mlflow_server, tmp_path):
    from recipes.registry import archive

    mlflow = registry.client()
    run_id = mlflow.create_run(registry.experiment_id(mlflow, alpha)).info.run_id
    (tmp_path / "meta.json").write_text("{}")
    for step in (4, 8):
        mlflow.log_artifacts(run_id, str(tmp_path), f"checkpoints/step-{step}")
    archive.forget(run_id, 4)
    assert [f.path for f in mlflow.list_artifacts(run_id, "checkpoints")] == ["checkpoints/step-8"]


def test_a_delete_whose_agent_is_silent_tries_one_run_and_says_which_were_not_kept(alpha, alice, scripted,
                                                                                   monkeypatch):  # fmt: skip
    from types import SimpleNamespace

    from clusters.services import create_cluster
    from console.errors import Unavailable
    from recipes.models import Run, RunStatus
    from recipes.runs import keep

    from .conftest import provisioned, scripted_spec

    cluster = create_cluster(project=alpha, name="silent", spec=scripted_spec(), user=alice).cluster
    provisioned(name="silent")
    runs = [Run.objects.create(cluster=cluster, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                               nodes=1, steps=6, config={}, script="", work_dir=f"/h/runs/{i}",
                               status=RunStatus.COMPLETED) for i in range(3)]  # fmt: skip
    tried = []

    def silent(run, final, wait):
        tried.append(run.pk)
        raise Unavailable("the cluster agent does not answer")

    monkeypatch.setattr(registry, "keep", silent)
    keep.keep_runs(SimpleNamespace(cluster=cluster, operation=None, heartbeat=lambda detail="": None))
    assert len(tried) == 1  # not one agent timeout per run
    for run in runs:
        run.refresh_from_db()
        assert run.archive["final"] and run.archive["skipped"].endswith("the cluster agent does not answer")
    warning = cluster.events.get(level="WARNING")
    assert warning.message.startswith("3 run(s) not kept in the registry before the cluster's deletion: ")


@pytest.mark.django_db(transaction=True)
def test_runs_register_themselves_and_their_versions_outlive_the_cluster(
    celery_worker, slurm, mlflow_server, alice_api, alice, client, charlie
):
    from clusters.choices import OperationStatus
    from clusters.models import Cluster, Operation
    from recipes.models import Run, RunStatus

    from .conftest import example_spec, stop_local_clusters, wait_until

    def finished(operation_id, timeout=120):
        operation = wait_until(lambda: Operation.objects.filter(uuid=operation_id, status__in=OperationStatus.done())
                               .first(), timeout=timeout, message="the operation")  # fmt: skip
        assert operation.status == OperationStatus.SUCCEEDED, operation.error

    def trained(body, timeout=240):
        response = alice_api.post("/api/v1/projects/alpha/clusters/reg/runs/", body, format="json")
        assert response.status_code == 202, response.content
        run = wait_until(lambda: Run.objects.filter(uuid=response.json()["id"], status__in=RunStatus.done()).first(),
                         timeout=timeout, interval=1, message="the run to end")  # fmt: skip
        assert run.status == RunStatus.COMPLETED, run.log_tail
        return run

    def registered(run, timeout=90):
        return wait_until(lambda: run.model_versions.first(), timeout=timeout, interval=0.5,
                          message=f"run {run.uuid} to register itself")  # fmt: skip

    created = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "reg", "spec": example_spec(cpu=1)},
                             format="json")  # fmt: skip
    assert created.status_code == 202, created.content
    try:
        finished(created.json()["id"], timeout=180)
        name = fresh("auto")
        tiny = {"recipe": "llama3.1-8b-pretrain", "profile": "tiny", "nodes": 1, "steps": 6, "register_as": name}
        first = trained(tiny)
        v1 = registered(first)
        assert (v1.name, v1.version, v1.automatic, v1.step) == (name, 1, True, 6)
        # The run was read when it ended; tracking may have made its MLflow run in the same sync, after.
        first.refresh_from_db()
        # It logged its params and every step's metrics to MLflow as it trained.
        mlflow = registry.client()
        assert [m.step for m in mlflow.get_metric_history(first.mlflow_run_id, "loss")] == list(range(1, 7))
        assert mlflow.get_run(first.mlflow_run_id).data.params["recipe"] == "llama3.1-8b-pretrain"
        v2 = registered(trained({**tiny, "alias": "staging"}))  # its launch moves an alias to it
        assert v2.version == 2

        def moved():  # the version row is written before the alias moves: wait for both
            from console.errors import FieldErrors

            try:
                return registry.resolve(v2.project, f"{name}@staging") == v2
            except FieldErrors:
                return False

        wait_until(moved, timeout=30, message="the alias to move")

        # production -> v1; SFT starts from the alias and its version names v1 as its parent.
        registry.set_alias(v1.project, name, "production", 1)
        sft = trained({"recipe": "llama3.1-8b-sft", "profile": "tiny", "nodes": 1, "steps": 3,
                       "init_from": f"{name}@production", "register_as": f"{name}-chat"})  # fmt: skip
        chat = registered(sft)
        assert chat.parent == v1 and sft.init_version == v1
        # A run may opt out of registering itself.
        quiet = trained({**tiny, "steps": 2, "register": False})
        stopped = dict(quiet.config)
        assert "register_as" not in stopped

        # The registry keeps each run's newest checkpoint and TensorBoard files as it goes.
        def kept_step(run, step):
            return wait_until(lambda: Run.objects.get(pk=run.pk).archive.get("step") == step, timeout=60,
                              interval=0.5, message=f"run {run.uuid}'s checkpoint step {step} to be kept")  # fmt: skip

        kept_step(first, 6)
        elsewhere = alice_api.post("/api/v1/projects/alpha/clusters/", format="json",
                                   data={"cluster_id": "reg-next", "spec": example_spec(cpu=1)})  # fmt: skip
        assert elsewhere.status_code == 202, elsewhere.content
        finished(elsewhere.json()["id"], timeout=180)

        # Deleting the cluster keeps every version, its lineage as names and its files in the registry.
        deleted = alice_api.delete("/api/v1/projects/alpha/clusters/reg/")
        assert deleted.status_code == 202, deleted.content
        finished(deleted.json()["id"], timeout=180)
        assert Cluster.objects.get(name="reg").status == "DELETED"
        kept = ModelVersion.objects.get(name=f"{name}-chat")
        assert kept.live_run is None and kept.cluster_name == "reg" and kept.parent.ref == f"{name}:v1"

        # ... and every run: its page, its curves, its newest checkpoint and its TensorBoard files.
        first.refresh_from_db()
        assert first.archive["step"] == 6 and first.archive["final"] and first.archive["bytes"] > 0
        assert [f.path for f in mlflow.list_artifacts(first.mlflow_run_id, "checkpoints")] == ["checkpoints/step-6"]
        events = [f.path for f in mlflow.list_artifacts(first.mlflow_run_id, "tensorboard")]
        assert any(path.startswith("tensorboard/events.out") for path in events), events
        client.force_login(alice)
        page = client.get(f"/clusters/alpha/reg/runs/{first.uuid}/")
        assert page.status_code == 200
        text = page.content.decode()
        assert "Its cluster was deleted" in text and 'id="loss-chart"' in text and "step <strong>6</strong>" in text
        assert alice_api.get(f"/api/v1/projects/alpha/clusters/reg/runs/{first.uuid}/").json()["archive"]["step"] == 6
        import io
        import zipfile

        files = client.get(f"/clusters/alpha/reg/runs/{first.uuid}/tensorboard-files/")
        assert files.status_code == 200 and files["Content-Type"] == "application/zip"
        assert any("events.out.tfevents" in n for n in zipfile.ZipFile(io.BytesIO(files.content)).namelist())
        from django.test import Client

        outsider = Client()
        outsider.force_login(charlie)  # the run outlives its cluster, not its project's walls
        for path in ("", "tensorboard-files/", "live/"):
            assert outsider.get(f"/clusters/alpha/reg/runs/{first.uuid}/{path}").status_code == 404
        refused = alice_api.post(f"/api/v1/projects/alpha/clusters/reg/runs/{first.uuid}/register/", {"name": "x"})
        assert refused.status_code == 409 and "cluster was deleted" in refused.json()["detail"]

        # Continued pretraining on another cluster starts from the kept checkpoint, at its step; the launch
        # page offers it.
        offered = client.get("/clusters/alpha/reg-next/runs/new/").content.decode()
        assert f'value="{first.uuid}"' in offered and "on reg (deleted), step 6 kept" in offered
        response = alice_api.post("/api/v1/projects/alpha/clusters/reg-next/runs/", format="json", data={
            "recipe": "llama3.1-8b-cpt", "profile": "tiny", "nodes": 1, "steps": 2, "init_from": str(first.uuid),
            "register": False})  # fmt: skip
        assert response.status_code == 202, response.content
        resumed = wait_until(lambda: Run.objects.filter(uuid=response.json()["id"], status__in=RunStatus.done())
                             .first(), timeout=240, interval=1, message="the resumed run to end")  # fmt: skip
        assert resumed.status == RunStatus.COMPLETED, resumed.log_tail
        assert resumed.init_from == first and resumed.config["steps"] == 8
        assert resumed.config["init_from"].endswith(f"/models/runs/{first.uuid}/step-6")
        assert resumed.metric_rows.first().step == 7
        assert ModelVersion.objects.filter(name=name).count() == 2
        assert quiet.model_versions.count() == 0
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as folder:
            files = Path(mlflow.download_artifacts(kept.mlflow_run_id, "model", folder))
            names = {p.name for p in files.iterdir()}
            assert {"config.json", "model.safetensors", "tokenizer.json", "tcc.json"} <= names
        client.force_login(alice)
        page = client.get(f"/models/alpha/{name}-chat/v1/").content.decode()
        assert "its cluster was deleted" in page and f'href="/models/alpha/{name}/v1/"' in page
    finally:
        stop_local_clusters()


def test_a_launch_from_a_version_whose_files_are_gone_is_a_400_and_submits_nothing(alpha, alice_api, mlflow_server):
    from recipes.models import Run

    from .conftest import example_spec, provisioned

    assert alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": example_spec(cpu=1)},
                          format="json").status_code == 202  # fmt: skip
    provisioned(name="demo")
    name = fresh()
    mlflow = registry.client()
    run_id = mlflow.create_run(registry.experiment_id(mlflow, alpha)).info.run_id  # no files logged
    registry.publish(alpha, name, f"{mlflow.get_run(run_id).info.artifact_uri}/model", run_id=run_id,
                     family="llama", step=3)  # fmt: skip
    response = alice_api.post("/api/v1/projects/alpha/clusters/demo/runs/", {"recipe": "llama3.1-8b-sft",
                              "nodes": 1, "init_from": f"{name}:v1"}, format="json")  # fmt: skip
    assert response.status_code == 400, response.content
    assert "files are missing from the registry's artifact store" in response.json()["init_from"][0]
    assert not Run.objects.exists()


def test_a_launch_preview_from_a_registered_version_writes_nothing_anywhere(
    alpha, alice, alice_api, client, mlflow_server, tmp_path, monkeypatch
):
    from clusters import services
    from recipes.models import Run

    from .conftest import example_spec, provisioned

    assert alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": example_spec(cpu=1)},
                          format="json").status_code == 202  # fmt: skip
    provisioned(name="demo")
    name = fresh()
    a_version(alpha, name, tmp_path)
    written = []
    for writer in ("write_file", "upload_folder", "submit_batch"):
        monkeypatch.setattr(services, writer, lambda *args, writer=writer, **kwargs: written.append(writer))
    monkeypatch.setattr(registry, "stage", lambda *args, **kwargs: written.append("stage"))
    client.force_login(alice)
    form = {"recipe": "llama3.1-8b-sft", "profile": "tiny", "nodes": "1", "steps": "2", "init_from": f"{name}:v1"}
    page = client.post("/clusters/alpha/demo/runs/new/", form)
    assert page.status_code == 200, page.context["errors"]
    assert "srun" in page.content.decode()  # the script it would submit
    assert written == [] and not Run.objects.exists()
