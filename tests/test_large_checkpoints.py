"""Checkpoints too big for the console to carry (over RUN_ARCHIVE_MAX_BYTES) go from the cluster straight
into the registry's bucket: a real MLflow server whose artifacts are in a (fake) Cloud Storage bucket signs
one URL per part, a real cluster agent PUTs each part from the shared home, MLflow completes the upload.
The checkpoint then comes back through MLflow byte for byte, and its bytes never passed through the
console. Persona: alice's run on her cluster saves a checkpoint larger than the console copies itself."""

import os

import pytest
from django.conf import settings as django_settings

from clusters.agent.client import AgentRefused
from clusters.services import create_cluster
from console.errors import Conflict
from recipes.models import Run, RunStatus
from recipes.registry import archive

from .conftest import agent_process, mlflow_process, provisioned, scripted_spec
from .factories import free_port
from .fake_gcs import FakeGCS

MIB = 1 << 20


@pytest.fixture(scope="module")
def gcs():
    fake = FakeGCS().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def bucket_registry(gcs, tmp_path_factory):
    """MLflow as production runs it with a bucket: --artifacts-destination gs://..., a service-account key."""
    root = tmp_path_factory.mktemp("bucket-registry")
    key = gcs.key_file(root / "mlflow-sa.json")
    port = free_port()
    environment = {"MLFLOW_ARTIFACTS_DESTINATION": "gs://tcc-models/mlflow", "API_ENDPOINT_OVERRIDE": gcs.url,
                   "GOOGLE_APPLICATION_CREDENTIALS": str(key), "GOOGLE_CLOUD_PROJECT": "tcc-tests"}  # fmt: skip
    with mlflow_process(root / "mlflow", port, **environment) as url:
        yield url, root / "mlflow" / "password"


@pytest.fixture(scope="module")
def cluster_agent(tmp_path_factory):
    with agent_process(tmp_path_factory.mktemp("large-agent")) as started:
        yield started


@pytest.fixture
def alices_run(settings, bucket_registry, cluster_agent, scripted, alpha, alice, monkeypatch):
    """alice's run on a cluster whose agent serves a scratch home; the console on the bucket registry, and a
    console that carries at most 1 MiB itself. A read by the console of a checkpoint file over its limit
    fails the test."""
    from clusters.services import files

    url, password = bucket_registry
    settings.MLFLOW_TRACKING_URI, settings.MLFLOW_PASSWORD_FILE = url, str(password)
    settings.RUN_ARCHIVE_MAX_BYTES, settings.RUN_ARCHIVE_PART_BYTES = MIB, 5 * MIB
    client, home, _root = cluster_agent
    scripted.agent_endpoint = lambda cluster: client.endpoint
    cluster = create_cluster(project=alpha, name="big", spec=scripted_spec(), user=alice).cluster
    provisioned(name="big")
    name = os.urandom(4).hex()
    run = Run.objects.create(cluster=cluster, recipe_id="llama3.1-8b-pretrain", profile="full", partition="cpu",
                             nodes=1, steps=10, config={}, script="", work_dir=f"/home/runs/{name}",
                             status=RunStatus.RUNNING)  # fmt: skip
    read = files.read_file

    def console_read(cluster, path, **kwargs):
        limit = django_settings.RUN_ARCHIVE_MAX_BYTES
        assert "checkpoints/" not in path or (home / path).stat().st_size <= limit, f"the console read {path} itself"
        return read(cluster, path, **kwargs)

    monkeypatch.setattr(files, "read_file", console_read)
    queued = []
    monkeypatch.setattr(archive, "later", lambda task, *args: queued.append((task, *args)))
    return run, home / "runs" / name, queued


def saved(folder, step, **sizes):
    """The checkpoint folder train.py renames into place: files of random bytes of the sizes given."""
    checkpoint = folder / "checkpoints" / f"step-{step}"
    checkpoint.mkdir(parents=True)
    written = {}
    for name, size in sizes.items():
        written[name.replace("_dot_", ".")] = os.urandom(size)
        (checkpoint / name.replace("_dot_", ".")).write_bytes(written[name.replace("_dot_", ".")])
    return written


def failing_at(file, error, monkeypatch):
    """direct.send_file raises `error` when it comes to the checkpoint's file `file`; the real one, returned."""
    from recipes.registry import direct

    send = direct.send_file

    def failing(cluster, repo, path, name, size, artifact_path, sent):
        if name == file:
            raise error
        return send(cluster, repo, path, name, size, artifact_path, sent)

    monkeypatch.setattr(direct, "send_file", failing)
    return send


def registry_copy(run, step, target):
    from recipes.registry import client

    folder = client().download_artifacts(run.mlflow_run_id, f"checkpoints/step-{step}", str(target))
    return {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}


@pytest.mark.django_db
def test_it_copies_a_checkpoint_over_the_limit_from_the_cluster_straight_into_the_bucket(
    alices_run, gcs, tmp_path, settings, monkeypatch
):
    run, folder, queued = alices_run
    settings.RUN_ARCHIVE_PARALLEL_PARTS = 3
    monkeypatch.setattr(gcs, "hold_parts", 3)  # a part waits for the others: one at a time would take 3 x 5 s
    gcs.most_parts_in_flight = 0
    written = saved(folder, 4, __0_0_dot_distcp=12 * MIB, meta_dot_json=300)
    kept = archive.keep(run)
    assert kept["copying"]["step"] == 4 and kept["copying"]["bytes"] == 12 * MIB + 300 and "step" not in kept
    assert queued == [("copy_checkpoint", run.pk, 4)]  # its own task copies it
    from celery import current_app

    assert "recipes.tasks.copy_checkpoint" in current_app.tasks  # the name `later` sends
    assert archive.keep(run) == Run.objects.get(pk=run.pk).archive and len(queued) == 1  # not twice

    archive.copy_checkpoint(run.pk, 4)
    run.refresh_from_db()
    assert run.archive["step"] == 4 and run.archive["direct"] and run.archive["bytes"] == 12 * MIB + 300
    assert "copying" not in run.archive
    parts = [(number, size) for name, number, size in gcs.part_puts if name.endswith(f"{run.mlflow_run_id}/artifacts/"
             "checkpoints/step-4/__0_0.distcp")]  # fmt: skip
    assert sorted(parts) == [(1, 5 * MIB), (2, 5 * MIB), (3, 2 * MIB)]  # 5 MiB parts, the last smaller
    assert gcs.most_parts_in_flight == 3  # all three under way at once
    assert registry_copy(run, 4, tmp_path) == written  # byte for byte, through MLflow


@pytest.mark.django_db
def test_a_newer_checkpoint_takes_the_older_ones_place_in_the_bucket(alices_run, tmp_path):
    from recipes.registry import client

    run, folder, _queued = alices_run
    saved(folder, 4, weights=6 * MIB)
    archive.keep(run)
    archive.copy_checkpoint(run.pk, 4)
    written = saved(folder, 8, weights=7 * MIB)
    archive.keep(run)
    archive.copy_checkpoint(run.pk, 8)
    run.refresh_from_db()
    assert run.archive["step"] == 8
    assert [f.path for f in client().list_artifacts(run.mlflow_run_id, "checkpoints")] == ["checkpoints/step-8"]
    assert registry_copy(run, 8, tmp_path) == written


@pytest.mark.django_db
def test_an_interrupted_copy_goes_on_from_the_file_where_it_stopped(alices_run, gcs, monkeypatch, tmp_path, client,
                                                                    alice):  # fmt: skip
    from celery.exceptions import SoftTimeLimitExceeded

    from recipes.registry import direct

    run, folder, _queued = alices_run
    written = saved(folder, 6, a=6 * MIB, b=6 * MIB)
    archive.keep(run)
    send = failing_at("b", SoftTimeLimitExceeded(), monkeypatch)
    with pytest.raises(SoftTimeLimitExceeded):
        archive.copy_checkpoint(run.pk, 6)  # the task's time limit: it retries
    run.refresh_from_db()
    assert run.archive["copying"]["files"] == {"a": 6 * MIB} and run.archive["copying"]["sent"] == 6 * MIB
    client.force_login(alice)  # her run's page shows how far the copy got
    page = client.get(f"/clusters/alpha/big/runs/{run.uuid}/").content.decode()
    assert "Copying step <strong>6</strong>" in page and 'aria-valuenow="50"' in page and "1 file whole" in page
    monkeypatch.setattr(direct, "send_file", send)
    before = len(gcs.part_puts)
    archive.copy_checkpoint(run.pk, 6)
    sent_again = {name.rsplit("/", 1)[1] for name, _number, _size in gcs.part_puts[before:]}
    assert sent_again == {"b"}  # a was not sent twice
    run.refresh_from_db()
    assert run.archive["step"] == 6 and registry_copy(run, 6, tmp_path) == written


@pytest.mark.django_db
def test_a_checkpoint_that_goes_while_it_is_copied_is_given_up_and_nothing_half_made_stays(alices_run, monkeypatch):
    from recipes.registry import client

    run, folder, _queued = alices_run
    saved(folder, 3, a=6 * MIB, b=6 * MIB)
    archive.keep(run)
    failing_at("b", Conflict("no such file: b"), monkeypatch)  # train.py removed the older of its two
    archive.copy_checkpoint(run.pk, 3)
    run.refresh_from_db()
    assert "copying" not in run.archive and "step" not in run.archive
    assert client().list_artifacts(run.mlflow_run_id, "checkpoints") == []


@pytest.mark.django_db
def test_a_store_that_takes_no_multipart_uploads_leaves_the_checkpoint_on_the_cluster_and_says_why(
    alices_run, mlflow_server, settings
):
    run, folder, _queued = alices_run
    settings.MLFLOW_TRACKING_URI = mlflow_server  # the embedded registry: MLflow's folder store
    settings.MLFLOW_PASSWORD_FILE = os.path.join(settings.MLFLOW_DIR, "password")
    saved(folder, 5, weights=2 * MIB)
    archive.keep(run)
    archive.copy_checkpoint(run.pk, 5)  # MLflow's server says so when asked to open the upload
    kept = Run.objects.get(pk=run.pk).archive
    assert "step" not in kept and "copying" not in kept
    assert kept["skipped"].startswith("step 5's checkpoint is 2.0 MiB, over the 1.0 MiB the console copies")
    assert "takes no multipart uploads" in kept["skipped"]


@pytest.mark.django_db
def test_a_cluster_being_deleted_copies_it_before_it_goes_and_a_copy_under_way_is_finished(alices_run, tmp_path):
    run, folder, queued = alices_run
    saved(folder, 2, weights=6 * MIB)
    archive.keep(run)  # the copy's task is queued, and has not run when the cluster's DELETE starts
    written = saved(folder, 3, weights=7 * MIB)
    kept = archive.keep(run, final=True, wait=True)  # the DELETE operation's step (runs/keep.py)
    assert kept["step"] == 3 and kept["final"] and "copying" not in kept
    assert registry_copy(run, 3, tmp_path) == written
    archive.copy_checkpoint(run.pk, 2)  # the older step's task, late: nothing to do
    assert Run.objects.get(pk=run.pk).archive["step"] == 3
    assert queued == [("copy_checkpoint", run.pk, 2)]


def copying_as(run, **fields):
    archive = Run.objects.get(pk=run.pk).archive
    archive["copying"].update(fields)
    Run.objects.filter(pk=run.pk).update(archive=archive)


@pytest.mark.django_db
def test_one_worker_copies_at_a_time_and_a_deleted_clusters_copy_takes_over(alices_run, gcs, tmp_path):
    from django.utils import timezone

    run, folder, _queued = alices_run
    written = saved(folder, 5, weights=6 * MIB)
    archive.keep(run)
    copying_as(run, owner="another-worker", at=timezone.now().isoformat())  # a live copy elsewhere
    before = len(gcs.part_puts)
    with pytest.raises(archive.CopyBusy):  # a second task for the same copy (a redelivery): it tries later
        archive.copy_checkpoint(run.pk, 5)
    assert len(gcs.part_puts) == before and Run.objects.get(pk=run.pk).archive["copying"]["owner"] == "another-worker"
    run.refresh_from_db()
    kept = archive.keep(run, final=True, wait=True)  # the cluster is going: its DELETE takes the copy over
    assert kept["step"] == 5 and "copying" not in kept and registry_copy(run, 5, tmp_path) == written


@pytest.mark.django_db
def test_a_copy_that_stalled_is_started_again_by_the_next_sync(alices_run):
    from datetime import timedelta

    from django.utils import timezone

    run, folder, queued = alices_run
    saved(folder, 7, weights=6 * MIB)
    archive.keep(run)
    copying_as(run, owner="lost-worker", at=(timezone.now() - timedelta(hours=1)).isoformat())
    run.refresh_from_db()
    archive.keep(run)
    assert queued == [("copy_checkpoint", run.pk, 7), ("copy_checkpoint", run.pk, 7)]
    assert "owner" not in Run.objects.get(pk=run.pk).archive["copying"]  # the new task may claim it
    archive.copy_checkpoint(run.pk, 7)
    assert Run.objects.get(pk=run.pk).archive["step"] == 7


@pytest.mark.django_db
def test_a_newer_checkpoint_kept_through_the_console_ends_the_older_large_ones_copy(alices_run, gcs):
    from recipes.registry import client

    run, folder, _queued = alices_run
    saved(folder, 4, weights=6 * MIB)
    archive.keep(run)
    saved(folder, 8, weights=MIB // 2)  # small: the console copies it itself
    kept = archive.keep(run)
    assert kept["step"] == 8 and "copying" not in kept and not kept.get("direct")
    before = len(gcs.part_puts)
    archive.copy_checkpoint(run.pk, 4)  # the older copy's task, late: nothing to do
    assert len(gcs.part_puts) == before
    assert [f.path for f in client().list_artifacts(run.mlflow_run_id, "checkpoints")] == ["checkpoints/step-8"]


@pytest.mark.django_db
def test_the_bucket_refuses_a_part_url_changed_after_signing_as_google_does(alices_run, cluster_agent, gcs):
    from recipes.registry import client, direct
    from recipes.registry.versions import mlflow_run

    run, folder, _queued = alices_run
    saved(folder, 1, weights=MIB)
    agent, _home, _root = cluster_agent
    repo = direct.repository(client(), mlflow_run(client(), run))
    created = repo.create_multipart_upload("weights", 1, "checkpoints/step-1")
    path = f"{run.in_home('checkpoints', 'step-1')}/weights"
    with pytest.raises(AgentRefused) as refused:  # another part number than the one signed
        agent.upload(path, created.credentials[0].url.replace("partNumber=1", "partNumber=2"), 0, MIB)
    assert refused.value.status == 502 and "403" in str(refused.value) and "SignatureDoesNotMatch" in str(refused.value)
    assert agent.upload(path, created.credentials[0].url, 0, MIB)["etag"]  # as signed: taken
    repo.abort_multipart_upload("weights", created.upload_id, "checkpoints/step-1")


@pytest.mark.django_db
def test_a_checkpoint_under_the_limit_still_goes_through_the_console_into_the_bucket(alices_run, settings, tmp_path):
    run, folder, queued = alices_run
    settings.RUN_ARCHIVE_MAX_BYTES = 64 * MIB
    written = saved(folder, 2, weights=10 * MIB, meta_dot_json=100)  # over 8 MiB: MLflow's resumable upload
    kept = archive.keep(run)
    assert kept["step"] == 2 and not kept.get("direct") and queued == []
    assert registry_copy(run, 2, tmp_path) == written


@pytest.mark.django_db
def test_a_copy_its_deleted_cluster_could_not_finish_is_given_up_with_the_reason(alices_run, monkeypatch):
    from types import SimpleNamespace

    from console.errors import Unavailable
    from recipes.registry import client
    from recipes.runs import keep

    run, folder, _queued = alices_run
    saved(folder, 9, a=6 * MIB, b=6 * MIB)
    archive.keep(run)
    failing_at("b", Unavailable("the cluster agent does not answer"), monkeypatch)
    keep.keep_runs(SimpleNamespace(cluster=run.cluster, operation=None, heartbeat=lambda detail="": None))
    run.refresh_from_db()
    assert run.archive["final"] and "copying" not in run.archive and "step" not in run.archive
    assert run.archive["skipped"].endswith("the cluster agent does not answer")
    assert client().list_artifacts(run.mlflow_run_id, "checkpoints") == []  # a's part is not left behind
