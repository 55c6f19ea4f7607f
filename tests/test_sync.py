"""The Slurm sync (clusters/services/sync.py) on the scripted backend: one sync pulls nodes and jobs
and writes only what changed; pages and GET endpoints read the database and never ask Slurm; the
jobs list filters and pages on the page and the API; a silent Slurm is flagged, never an error page.

Personas: alice (admin of alpha) watches her cluster "ok"; charlie belongs to another project."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters import services, tasks
from clusters.choices import EventLevel
from clusters.models import Cluster, SlurmJob, SlurmSync
from clusters.operations import engine
from clusters.slurm.states import JobStatus

from .conftest import api_client_for, scripted_spec

pytestmark = pytest.mark.django_db

API = "/api/v1/projects/alpha/clusters/ok/"
PAGE = "/clusters/alpha/ok/"


@pytest.fixture
def cluster(scripted, alpha, alice):
    operation = services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=3), user=alice)
    engine.run(operation.pk)
    return Cluster.objects.get(name="ok")


@pytest.fixture
def alice_web(client, alice):
    client.force_login(alice)
    return client


def job(job_id, state="RUNNING", **fields):
    values = {"name": f"job-{job_id}", "user": "alice", "partition": "cpu", "nodes": "cpu-0", "node_count": 1}
    return JobStatus(job_id=job_id, state=state, **{**values, **fields})


def writes(queries, table):
    return [q["sql"] for q in queries if table in q["sql"] and q["sql"].split()[0] in ("INSERT", "UPDATE")]


def test_it_writes_only_what_changed_in_bulk(cluster, scripted):
    scripted.queue = [job(i, "PENDING" if i % 2 else "RUNNING") for i in range(1, 301)]
    assert services.sync_cluster(cluster) == ""
    state = SlurmSync.objects.get(pk=cluster.pk)
    assert (state.nodes_written, state.jobs_written) == (3, 300)
    assert cluster.slurm_jobs.count() == 300
    assert sorted(cluster.compute_nodes().values_list("slurm_state", flat=True)) == ["idle"] * 3

    with CaptureQueriesContext(connection) as unchanged:
        assert services.sync_cluster(cluster) == ""
    assert len(unchanged.captured_queries) < 20  # a handful per sync, not one per node or job
    assert writes(unchanged.captured_queries, "clusters_node") == []
    assert writes(unchanged.captured_queries, "clusters_slurmjob") == []

    scripted.down.add("cpu-1")
    scripted.queue[-1] = job(300, "COMPLETED", exit_code=0)  # the newest job ended
    # Job 1 aged out of Slurm's memory (older than anything it reports); job 150 vanished from the middle.
    scripted.queue = [j for j in scripted.queue if j.job_id not in (1, 150)]
    with CaptureQueriesContext(connection) as changed:
        services.sync_cluster(cluster)
    assert len(writes(changed.captured_queries, "clusters_node")) == 1  # one bulk UPDATE
    assert len(writes(changed.captured_queries, "clusters_slurmjob")) == 2  # the ended job, the lost ones
    assert SlurmSync.objects.get(pk=cluster.pk).nodes_written == 1
    assert cluster.nodes.get(name="cpu-1").slurm_state == "down"
    assert SlurmJob.objects.get(cluster=cluster, job_id=300).state == "COMPLETED"
    assert SlurmJob.objects.get(cluster=cluster, job_id=1).state == "UNKNOWN"
    assert SlurmJob.objects.get(cluster=cluster, job_id=150).state == "UNKNOWN"
    assert SlurmJob.objects.filter(cluster=cluster, state="UNKNOWN").count() == 2


def test_a_hook_that_raises_is_an_event_and_the_sync_and_the_other_hooks_still_finish(cluster, scripted, monkeypatch):
    from clusters.services import sync

    seen = []

    def broken(cluster, jobs):
        raise RuntimeError("the registry exploded")

    def after(cluster, jobs):
        seen.append(sorted(jobs))

    monkeypatch.setattr(sync, "HOOKS", [broken, after])
    scripted.queue = [job(7)]
    assert services.sync_cluster(cluster) == ""
    assert seen == [[7]]
    assert cluster.slurm_jobs.get().job_id == 7 and SlurmSync.objects.get(pk=cluster.pk).error == ""
    failures = cluster.events.filter(level=EventLevel.ERROR, message__contains="the registry exploded")
    assert failures.count() == 1 and "broken failed: RuntimeError" in failures.get().message
    assert services.sync_cluster(cluster) == "" and seen == [[7], [7]]
    assert failures.count() == 1  # once on the timeline, not once per sync

    assert services.sync_cluster(cluster, hooks=False) == ""  # the pull round alone (scans, repairs)
    assert seen == [[7], [7]]


def test_pages_and_get_endpoints_read_the_database_and_never_ask_slurm(cluster, scripted, alice_web, alice):
    scripted.queue = [job(7)]
    services.sync_cluster(cluster)
    calls = scripted.slurm_calls
    api = api_client_for(alice)
    for _tab in range(5):  # five open tabs polling
        for path in ("", "nodes/", "jobs/", "nodes/cpu-0/", "events/", "health/"):
            assert alice_web.get(PAGE + path, HTTP_HX_REQUEST="true").status_code in (200, 286), path
        for path in ("", "nodes/", "jobs/", "nodes/cpu-0/"):
            assert api.get(API + path).status_code == 200, path
    assert scripted.slurm_calls == calls
    assert 'data-job="7"' in alice_web.get(PAGE + "jobs/").content.decode()
    response = api.get(API + "nodes/")
    assert response["Slurm-Synced"] and "Warning" not in response
    states = {n["name"]: n["slurm_state"] for n in response.json()}
    assert states == {"cpu-0": "idle", "cpu-1": "idle", "cpu-2": "idle", "login-0": ""}


def test_the_jobs_list_filters_and_pages_on_the_page(cluster, scripted, alice_web):
    scripted.queue = [
        job(i, state="RUNNING" if i % 3 else "PENDING", user="bob" if i % 5 == 0 else "alice", name=f"train-{i}")
        for i in range(1, 121)
    ]
    services.sync_cluster(cluster)
    html = alice_web.get(PAGE + "jobs/").content.decode()
    assert html.count("data-job=") == 50 and 'data-job="120"' in html and "of 120" in html
    assert "page=2" in html  # the Older button
    html = alice_web.get(PAGE + "jobs/", {"page": 3}).content.decode()
    assert html.count("data-job=") == 20 and 'data-job="1"' in html
    assert "page=3" in html.split("hx-trigger")[0]  # the fragment polls its own page, not page 1
    html = alice_web.get(PAGE + "jobs/", {"state": "pending", "user": "bob"}).content.decode()
    assert sorted(int(x.split('"')[0]) for x in html.split('data-job="')[1:]) == [15, 30, 45, 60, 75, 90, 105, 120]
    assert "state=pending" in html and "user=bob" in html  # kept across polls and pages
    html = alice_web.get(PAGE + "jobs/", {"q": "42"}).content.decode()
    assert html.count("data-job=") == 1 and 'data-job="42"' in html
    html = alice_web.get(PAGE + "jobs/", {"q": "no-such"}).content.decode()
    assert "No job matches these filters" in html
    response = alice_web.get(PAGE + "jobs/", {"state": "vibes"})
    assert response.status_code == 200 and "is not a Slurm job state" in response.content.decode()


def test_the_jobs_api_pages_with_a_cursor_and_refuses_bad_filters(cluster, scripted, alice, charlie_api):
    scripted.queue = [job(i, state="COMPLETED" if i <= 200 else "RUNNING", exit_code=0) for i in range(1, 251)]
    services.sync_cluster(cluster)
    api = api_client_for(alice)
    seen, url = [], API + "jobs/?limit=100"
    while url:
        body = api.get(url).json()
        assert body["synced"] and body["slurm_error"] == ""
        seen += [j["job_id"] for j in body["results"]]
        url = body["next"]
    assert seen == list(range(250, 0, -1))
    running = api.get(API + "jobs/", {"state": "running", "limit": 1000}).json()["results"]
    assert [j["job_id"] for j in running] == list(range(250, 200, -1))
    assert api.get(API + "jobs/", {"state": "COMPLETED,running"}).json()["results"][0]["job_id"] == 250
    bad = api.get(API + "jobs/", {"state": "vibes", "user": "a b", "q": "x" * 201})
    assert bad.status_code == 400 and set(bad.json()) == {"state", "user", "q"}
    assert api.get(API + "jobs/", {"cursor": "not-a-cursor"}).status_code == 400
    assert api.get(API + "jobs/", {"cursor": "cD1hYmM="}).status_code == 400  # p=abc: a forged position
    assert api.get(API + "jobs/", {"limit": "abc"}).status_code == 400
    assert api.get(API + "jobs/", {"limit": 1001}).status_code == 400
    assert charlie_api.get(API + "jobs/").status_code == 404


def test_a_silent_slurm_keeps_the_last_state_is_flagged_and_noted_once(cluster, scripted, alice_web, alice):
    scripted.queue = [job(5)]
    services.sync_cluster(cluster)
    scripted.silent = True
    for _ in range(3):
        assert "connection refused" in services.sync_cluster(cluster)
    state = SlurmSync.objects.get(pk=cluster.pk)
    assert state.failing_since and state.synced < timezone.now()
    warnings = cluster.events.filter(level=EventLevel.WARNING, message__startswith="Slurm is not answering")
    assert warnings.count() == 1  # the timeline says so once, not every sync
    html = alice_web.get(PAGE + "nodes/").content.decode()
    assert 'data-sync="failing"' in html and "Slurm not answering since" in html and ">idle<" in html
    assert 'data-job="5"' in alice_web.get(PAGE + "jobs/").content.decode()
    assert alice_web.get(PAGE).status_code == 200
    response = api_client_for(alice).get(API + "jobs/")
    assert response.status_code == 200 and "Slurm is not answering" in response["Warning"]
    assert "connection refused" in response.json()["slurm_error"]

    scripted.silent = False
    assert services.sync_cluster(cluster) == ""
    assert SlurmSync.objects.get(pk=cluster.pk).failing_since is None
    assert cluster.events.filter(message__startswith="Slurm answers again").count() == 1
    assert 'data-sync="fresh"' in alice_web.get(PAGE + "nodes/").content.decode()


def test_state_the_sync_has_not_refreshed_for_long_is_flagged_stale(cluster, alice_web, settings):
    html = alice_web.get(PAGE + "nodes/").content.decode()
    assert 'data-sync="none"' in html and "Waiting for the first sync" in html
    services.sync_cluster(cluster)
    SlurmSync.objects.filter(pk=cluster.pk).update(synced=timezone.now() - timedelta(minutes=5))
    html = alice_web.get(PAGE + "nodes/").content.decode()
    assert 'data-sync="stale"' in html and "no sync for 300 s" in html


def test_a_sync_another_worker_holds_is_not_repeated(cluster, scripted):
    services.sync_cluster(cluster)
    calls = scripted.slurm_calls
    SlurmSync.objects.filter(pk=cluster.pk).update(claimed_until=timezone.now() + timedelta(seconds=30))
    tasks.sync_cluster(cluster.pk)
    assert scripted.slurm_calls == calls
    SlurmSync.objects.filter(pk=cluster.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    tasks.sync_cluster(cluster.pk)  # a lease its worker never gave back expires
    assert scripted.slurm_calls == calls + 2
    assert SlurmSync.objects.get(pk=cluster.pk).claimed_until is None


def test_only_clusters_whose_slurm_may_be_up_are_synced(cluster, scripted):
    calls = scripted.slurm_calls
    Cluster.objects.filter(pk=cluster.pk).update(status="DELETED")
    assert services.sync_cluster(Cluster.objects.get(pk=cluster.pk)) == ""
    assert scripted.slurm_calls == calls


@pytest.mark.django_db(transaction=True)
def test_celery_beat_keeps_the_database_in_step_with_slurm(redis_broker, scripted, alpha, alice, tmp_path):
    """A real worker running beat (real Redis): the periodic sync fills in Slurm's node states and
    then keeps them current, with nobody looking at a page."""
    from .conftest import Worker, purge_queue, wait_until

    operation = services.create_cluster(project=alpha, name="ok", spec=scripted_spec(cpu=2), user=alice)
    engine.run(operation.pk)
    cluster = Cluster.objects.get(name="ok")
    purge_queue(redis_broker)
    worker = Worker(tmp_path / "worker.log", beat=True, CONSOLE_SCRIPTED_BACKEND=1, SLURM_SYNC_SECONDS=1)
    try:
        first = wait_until(
            lambda: (
                SlurmSync.objects.filter(pk=cluster.pk, synced__isnull=False).values_list("synced", flat=True).first()
            ),
            timeout=60,
            message="the first periodic sync",
        )
        assert sorted(cluster.compute_nodes().values_list("slurm_state", flat=True)) == ["idle", "idle"]
        wait_until(
            lambda: SlurmSync.objects.get(pk=cluster.pk).synced > first, timeout=30, message="a second sync round"
        )
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert "clusters.tasks.sync_cluster" in log and "Traceback" not in log


def test_the_service_paths_list_jobs_with_page_tokens_and_a_filter(cluster, scripted, alice, charlie):
    """v1beta1 .../modelDevelopmentClusters/ok/slurmJobs: the console's extension of the service's paths."""
    from console.models import APIToken

    scripted.queue = [job(i, state="FAILED" if i % 10 == 0 else "RUNNING", user="bob" if i > 60 else "alice")
                      for i in range(1, 101)]  # fmt: skip
    services.sync_cluster(cluster)
    Cluster.objects.filter(pk=cluster.pk).update(location="us-central1")
    url = "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters/ok/slurmJobs"
    _token, raw = APIToken.issue(alice, "jobs")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    from django.test import Client

    client = Client()
    seen, token = [], None
    while True:
        body = client.get(url, {"pageSize": 30, **({"pageToken": token} if token else {})}, **headers).json()
        assert body["syncTime"]
        seen += [j["jobId"] for j in body["slurmJobs"]]
        token = body.get("nextPageToken")
        if not token:
            break
    assert seen == list(range(100, 0, -1))
    failed = client.get(url, {"filter": 'state=failed AND user="bob"'}, **headers).json()["slurmJobs"]
    assert [j["jobId"] for j in failed] == [100, 90, 80, 70]
    assert failed[0]["name"].endswith("/modelDevelopmentClusters/ok/slurmJobs/100")
    bad = client.get(url, {"filter": "colour=red"}, **headers)
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    bad = client.get(url, {"filter": "state=vibes"}, **headers).json()["error"]
    assert "filter.state" in str(bad["details"])
    assert client.get(url, {"pageToken": "bm9wZQ=="}, **headers).status_code == 400
    _token, outsider = APIToken.issue(charlie, "jobs")
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {outsider}").status_code == 403


def test_a_sync_round_that_waits_is_not_dropped_and_none_piles_up(cluster, scripted, monkeypatch, redis_broker):
    """Each cluster's sync expired when the next was due: a worker steadily behind (every periodic task
    shares its queue) dropped every round and the cluster was never synced again. A round now waits
    however late, and the next beat sends none for a cluster whose round still waits."""
    from .conftest import purge_queue

    sent = []
    monkeypatch.setattr(tasks.sync_cluster, "apply_async", lambda args, expires: sent.append((args, expires)))
    try:
        tasks.sync_clusters()
        tasks.sync_clusters()
        assert sent == [((cluster.pk,), settings.PERIODIC_ROUND_TIMEOUT)]
        tasks.sync_cluster(cluster.pk)  # the round runs (late or not): the next one may be sent
        tasks.sync_clusters()
        assert len(sent) == 2 and SlurmSync.objects.filter(cluster=cluster).exists()
    finally:
        purge_queue(redis_broker)


def test_a_round_that_could_not_be_sent_holds_nothing_back(cluster, scripted, monkeypatch, redis_broker):
    from .conftest import purge_queue

    def broker_down(args, expires):
        raise ConnectionError("the broker is not answering")

    monkeypatch.setattr(tasks.sync_cluster, "apply_async", broker_down)
    try:
        with pytest.raises(ConnectionError):
            tasks.sync_clusters()
        sent = []
        monkeypatch.setattr(tasks.sync_cluster, "apply_async", lambda args, expires: sent.append(args))
        tasks.sync_clusters()
        assert sent == [(cluster.pk,)]
    finally:
        purge_queue(redis_broker)
