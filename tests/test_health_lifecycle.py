"""A cluster's health over its life: READY only once its first scan passes, repairs judged by the
check that failed, periodic scans on an editable schedule, node pages and the remediation history.

rosa owns project "rlab" with cluster "train" (2 local nodes, shared by the module); charlie is an
outsider. Operations run in-process through the service layer (the Celery path is tested elsewhere).
"""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from clusters import services
from clusters.backends import get_backend
from clusters.choices import ClusterStatus, OperationKind, OperationStatus
from clusters.health import faults, repair, scans
from clusters.health.scans import start_scan, targets
from clusters.health.schedule import run_due_scans, run_one, schedule_for
from clusters.models import Cluster, HealthResult, HealthSchedule, Operation
from clusters.operations import engine

from .conftest import api_client_for, example_spec, module_cluster, synced, wait_until

pytestmark = pytest.mark.django_db
API = "/api/v1/projects/rlab/clusters/train/"


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, slurm):
    with module_cluster(django_db_blocker, username="rosa", project_slug="rlab") as found:
        yield found


@pytest.fixture
def rosa(cluster):
    return cluster.project.members.get()


@pytest.fixture
def rosa_api(rosa):
    return api_client_for(rosa)


@pytest.fixture
def rosa_web(client, rosa):
    client.force_login(rosa)
    return client


@pytest.fixture
def own_clusters(cluster):
    """Clusters a test creates beside the module's are stopped when it ends: their rows roll back, so
    the next test's cluster could get the same id, and with it the same folder and ports."""
    before = set(Cluster.objects.values_list("pk", flat=True))
    yield
    for extra in Cluster.objects.exclude(pk__in=before):
        for step in get_backend(extra.backend).delete_steps(extra):
            step.run(None)


def run(operation):
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return operation


def timeline(cluster):
    return list(cluster.events.order_by("id").values_list("message", flat=True))


def test_a_new_cluster_is_ready_only_once_its_first_scan_passes(cluster):
    create = cluster.operations.get(kind=OperationKind.CREATE)
    assert cluster.status == ClusterStatus.READY
    assert {r.node for r in create.health_results.all()} == {"cpu-0", "cpu-1"}
    assert not create.health_results.filter(status="fail").exists()
    assert "First health scan: Compare nodes and record results" in [entry["step"] for entry in create.log]
    assert "Cluster ready: 2 compute nodes idle in Slurm; the first health scan passed" in timeline(cluster)


def test_a_failed_first_scan_keeps_the_cluster_verifying_until_the_node_is_replaced(
    rosa, cluster, settings, own_clusters, monkeypatch
):
    settings.AUTO_REPAIR = True
    create = services.create_cluster(project=cluster.project, name="fresh", spec=example_spec(), user=rosa)

    def broken_from_the_start(ctx):
        # Wrong results from the very start: the fault file is in place (through the new cluster's
        # agent) before the first scan is sent.
        if ctx.operation.pk == create.pk:
            faults.inject(Cluster.objects.get(pk=create.cluster_id), "cpu-1", "perturb")
        return real_submit(ctx)

    real_submit = scans.submit
    monkeypatch.setattr(scans, "submit", broken_from_the_start)
    run(create)
    fresh = Cluster.objects.get(pk=create.cluster_id)
    assert fresh.status == ClusterStatus.VERIFYING
    assert "failing: cpu-1 correctness" in fresh.status_message
    assert not fresh.is_usable  # no recipe runs or updates until it is ready
    fix = Operation.objects.get(cluster=fresh, kind=OperationKind.REPAIR)
    assert (fix.params["node"], fix.params["action"], fix.params["checks"]) == ("cpu-1", "replace", ["correctness"])
    run(fix)
    fresh.refresh_from_db()
    assert fresh.status == ClusterStatus.READY, timeline(fresh)
    assert set(fresh.compute_nodes().values_list("name", flat=True)) == {"cpu-0", "cpu-2"}
    events = timeline(fresh)
    assert "Repaired cpu-1 (correctness) by replace: correctness passes on all 2 scanned nodes" in events
    assert events[-1] == "Cluster ready: every node passes its health checks again"


def test_a_node_added_by_a_resize_takes_no_job_before_its_first_scan_passes(
    rosa, cluster, settings, monkeypatch, own_clusters
):
    settings.AUTO_REPAIR = True
    grow = Cluster.objects.get(
        pk=run(services.create_cluster(project=cluster.project, name="grow", spec=example_spec(), user=rosa)).cluster_id
    )
    backend = get_backend("local")
    update = services.update_cluster(cluster=grow, spec=example_spec(cpu=3), user=rosa)
    faults.inject(grow, "cpu-2", "perturb")  # the new machine computes wrong results
    pinned = {}

    def submit_beside_a_user_job(operation):
        # The moment the new node is up and before its scan: rosa's job asks for that node.
        if not pinned:
            services.write_file(
                grow, "pinned.sbatch", "#!/bin/bash\n#SBATCH --nodelist=cpu-2\n#SBATCH --output=/dev/null\nhostname\n"
            )
            pinned["id"] = backend.submit_batch(grow, "pinned.sbatch")
        return real_submit(operation)

    real_submit = scans.submit
    monkeypatch.setattr(scans, "submit", submit_beside_a_user_job)
    run(update)
    assert update.checkpoint["held"] == ["cpu-2"]
    assert {r.node for r in update.health_results.all()} == {"cpu-2"}  # only the new node is scanned
    job = backend.job_status(grow, pinned["id"])
    assert job.state == "PENDING", job  # it never ran on the held node, and the node is drained now
    node = next(s for s in backend.node_statuses(grow) if s.name == "cpu-2")
    assert "drain" in node.display_state and node.reason == "tcc correctness: failed its first health scan"
    backend.cancel_job(grow, pinned["id"])
    grow.refresh_from_db()
    assert grow.status == ClusterStatus.VERIFYING
    fix = Operation.objects.get(cluster=grow, kind=OperationKind.REPAIR)
    run(fix)
    assert fix.checkpoint["held"] == ["cpu-3"]  # the replacement is held until its verification passes
    grow.refresh_from_db()
    assert grow.status == ClusterStatus.READY, timeline(grow)
    assert backend.slurm(grow).reservations() == {}
    events = timeline(grow)
    assert any(e.startswith("Update done (3 compute nodes idle in Slurm) but not ready") for e in events), events
    assert "Repaired cpu-2 (correctness) by replace: correctness passes on all 3 scanned nodes" in events


def test_a_hold_keeps_other_jobs_off_its_node_until_it_ends(cluster):
    backend = get_backend("local")
    folder = Path(backend.shared_dir(cluster))

    def job(name, *options):
        script = folder / f"{name}.sbatch"
        script.write_text(
            "\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in options), "#SBATCH --output=/dev/null", "true", ""])
        )
        return backend.submit_batch(cluster, script.name)

    def state(job_id):
        found = backend.job_status(cluster, job_id)
        return found.state if found else "GONE"

    backend.hold(cluster, "tcc-hold-test", ["cpu-1"])
    backend.hold(cluster, "tcc-hold-test", ["cpu-1"])  # again: the same hold
    try:
        users = job("users", "--nodelist=cpu-1")
        scan = job("scan", "--nodelist=cpu-0,cpu-1", "--nodes=2", "--reservation=tcc-hold-test")
        # The job asking for the hold runs, on the held node and another (FLEX) ...
        wait_until(lambda: state(scan) in ("COMPLETED", "GONE"), timeout=30, message="the hold's own job to run")
        # ... while the other job waits, and its node is left out of scans that do not hold it.
        assert state(users) == "PENDING"
        assert "held for another operation's scan" in targets(cluster)[1]["cpu-1"]
        assert targets(cluster, held=["cpu-1"])[0] == {"cpu": ["cpu-0", "cpu-1"]}
    finally:
        backend.release(cluster, "tcc-hold-test")
    backend.release(cluster, "tcc-hold-test")  # a hold that is gone already is fine
    wait_until(lambda: state(users) in ("COMPLETED", "GONE"), timeout=30, message="the other job to run")


def test_it_refuses_bad_scans_with_field_messages_and_starts_nothing(rosa_api, cluster):
    before = Operation.objects.count()
    response = rosa_api.post(
        API + "scans/",
        {
            "checks": ["disk", "vibes"],
            "thresholds": {"speed": {"straggler_fraction": 2}, "vibes": {}, "disk": {"min_free_fraction": "lots"}},
        },
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert "unknown check 'vibes'" in body["checks"][0]
    assert body["thresholds.speed.straggler_fraction"] == ["must be a fraction between 0 and 1"]
    assert body["thresholds.disk.min_free_fraction"] == ["must be a number"]
    assert "unknown check" in body["thresholds.vibes"][0]
    Cluster.objects.filter(pk=cluster.pk).update(status=ClusterStatus.UPDATING)
    response = rosa_api.post(API + "scans/", {}, format="json")
    assert response.status_code == 400
    assert "is updating; scans run on a ready" in response.json()["cluster"][0]
    assert Operation.objects.count() == before


def test_a_threshold_override_holds_for_its_scan_only(rosa_api, cluster, settings):
    settings.AUTO_REPAIR = False
    strict = rosa_api.post(
        API + "scans/", {"checks": ["disk"], "thresholds": {"disk": {"min_free_fraction": 0.9999}}}, format="json"
    )
    assert strict.status_code == 202, strict.content
    results = run(Operation.objects.get(uuid=strict.json()["id"])).health_results.all()
    assert {(r.status, r.threshold["min_free_fraction"]) for r in results} == {("fail", 0.9999)}
    plain = rosa_api.post(API + "scans/", {"checks": ["disk"]}, format="json").json()
    results = run(Operation.objects.get(uuid=plain["id"])).health_results.all()
    assert {r.status for r in results} == {"pass"}
    # The newer scan's results are the latest ones: one per node and check, read by the grid and repairs.
    latest = HealthResult.objects.filter(cluster=cluster, check_name="disk", latest=True)
    assert sorted(latest.values_list("node", "status")) == [("cpu-0", "pass"), ("cpu-1", "pass")]
    assert "disk" not in str(repair.outstanding(cluster))


def test_the_migration_marks_the_newest_result_of_each_node_and_check_as_latest(cluster):
    from importlib import import_module

    from django.apps import apps

    run(start_scan(cluster=cluster, checks=["disk"]))  # the first scan's disk results are older now
    marked = set(HealthResult.objects.filter(latest=True).values_list("id", flat=True))
    assert HealthResult.objects.filter(latest=False, check_name="disk").count() == 2
    HealthResult.objects.update(latest=False)  # results as they were before the flag existed
    import_module("clusters.migrations.0008_health_result_latest").mark_latest(apps, None)
    assert set(HealthResult.objects.filter(latest=True).values_list("id", flat=True)) == marked


def test_a_due_schedule_starts_one_scan_and_moves_its_next_run(cluster):
    schedule = schedule_for(cluster)
    assert (schedule.enabled, schedule.every_minutes) == (True, 24 * 60)
    due = timezone.now() - timedelta(minutes=1)
    HealthSchedule.objects.filter(pk=schedule.pk).update(next_run=due, checks=["disk"])
    stale = HealthSchedule.objects.get(pk=schedule.pk)
    outcomes = run_due_scans()
    assert outcomes[cluster.pk].startswith("started scan ")
    assert run_due_scans() == {}  # not due any more
    assert run_one(stale, timezone.now()) == "claimed elsewhere"  # a second beat with an old copy
    scan = Operation.objects.get(cluster=cluster, kind=OperationKind.SCAN)
    assert scan.params["checks"] == ["disk"] and scan.params["idle_only"] is True
    schedule.refresh_from_db()
    assert schedule.next_run > timezone.now() + timedelta(hours=23)
    run(scan)
    assert "Health scan on schedule (every 24 h): disk" in timeline(cluster)


def test_a_scheduled_scan_leaves_busy_nodes_alone_and_waits_when_none_is_idle(cluster):
    backend = get_backend("local")
    script = backend.shared_dir(cluster) / "busy.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --exclusive\n#SBATCH --output=/dev/null\nsleep 120\n")
    jobs = [backend.submit_batch(cluster, script.name)]
    try:
        wait_until(lambda: len(targets(cluster, idle_only=True)[0].get("cpu", [])) == 1, message="one node busy")
        nodes, skipped = targets(cluster, idle_only=True)
        busy = next(iter(skipped))
        assert "running jobs" in skipped[busy]
        scan = run(start_scan(cluster=cluster, checks=["disk"], idle_only=True))
        assert {r.node for r in scan.health_results.all()} == set(nodes["cpu"])
        assert busy in scan.checkpoint["skipped_nodes"]
        jobs.append(backend.submit_batch(cluster, script.name))
        wait_until(lambda: not targets(cluster, idle_only=True)[0], message="both nodes busy")
        schedule = schedule_for(cluster)
        HealthSchedule.objects.filter(pk=schedule.pk).update(next_run=timezone.now())
        outcome = run_due_scans()[cluster.pk]
        assert outcome == "skipped: no idle node; trying again in an hour"
        schedule.refresh_from_db()
        assert timedelta(minutes=59) < schedule.next_run - timezone.now() <= timedelta(hours=1)
    finally:
        for job in jobs:
            backend.cancel_job(cluster, job)
        wait_until(lambda: len(targets(cluster, idle_only=True)[0].get("cpu", [])) == 2, message="nodes idle again")


def test_it_edits_the_schedule_and_answers_bad_values_with_field_errors(rosa_api, rosa_web, cluster):
    url = API + "health/schedule/"
    bad = rosa_api.patch(url, {"every_minutes": 2, "checks": ["vibes"], "enabled": "yes", "colour": 1}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"every_minutes", "checks", "enabled", "colour"}
    assert rosa_api.get(url).json()["every_minutes"] == 24 * 60  # nothing changed
    good = rosa_api.patch(url, {"every_minutes": 60, "checks": ["disk", "speed"]}, format="json")
    assert good.status_code == 200
    assert good.json()["checks"] == ["disk", "speed"]
    page = "/clusters/rlab/train/health/schedule/"
    response = rosa_web.post(page, {"enabled": "on", "every_hours": "soon", "checks": ["disk"]})
    assert response.status_code == 400
    html = response.content.decode()
    assert "must be a number of hours" in html and 'value="soon"' in html  # the input is kept
    response = rosa_web.post(page, {"enabled": "on", "every_hours": "0.5", "idle_only": "on"})
    assert response.status_code == 200 and "Saved." in response.content.decode()
    assert HealthSchedule.objects.get(cluster=cluster).every_minutes == 30


def test_node_page_and_api_show_checks_history_repairs_and_events(rosa_api, rosa_web, client, cluster, settings):
    settings.AUTO_REPAIR = False
    run(start_scan(cluster=cluster, checks=["speed", "disk"]))
    fix = run(repair.start_repair(cluster, "cpu-1", "disk", "rehearsal", verify=True))
    assert fix.params["action"] == "clean_scratch"
    html = rosa_web.get("/clusters/rlab/train/nodes/cpu-1/").content.decode()
    assert 'data-check="speed"' in html and 'id="speed-chart"' in html  # two scans: a chart
    assert "checksum " in html and "/tmp.free_fraction " in html  # values as text, checksums shortened
    assert 'id="node-repairs"' in html and "clean_scratch" in html
    assert "Repaired cpu-1 (disk) by clean_scratch: disk passes on all 2 scanned nodes" in html
    node = rosa_api.get(API + "nodes/cpu-1/").json()
    assert node["checks"]["disk"]["status"] == "pass"
    assert node["repairs"][0]["action"] == "clean_scratch"
    assert node["repairs_taken"] == {"disk": 1}
    assert any(e["message"].startswith("Detected disk on cpu-1") for e in node["events"])
    history = rosa_api.get(API + "repairs/").json()["results"]
    assert [(r["node"], r["failure"], r["verified_by"], r["status"]) for r in history] == [
        ("cpu-1", "disk", ["disk"], "SUCCEEDED")
    ]
    assert rosa_api.get(API + "repairs/?node=cpu-0").json()["results"] == []
    assert rosa_api.get(API + "nodes/cpu-9/").status_code == 404


def test_the_scan_page_polls_until_done_then_shows_its_results(rosa_web, cluster):
    response = rosa_web.post("/clusters/rlab/train/scan/")
    scan = Operation.objects.get(cluster=cluster, kind=OperationKind.SCAN)
    assert response.status_code == 302 and response["Location"].endswith(f"/scans/{scan.uuid}/")
    progress = f"/clusters/rlab/train/scans/{scan.uuid}/progress/"
    waiting = rosa_web.get(progress, HTTP_HX_REQUEST="true")
    assert waiting.status_code == 200 and "waiting for a worker" in waiting.content.decode()
    run(scan)
    done = rosa_web.get(progress, HTTP_HX_REQUEST="true")
    assert done.status_code == 286  # htmx stops polling
    assert 'id="health-grid"' in done.content.decode() and 'data-node="cpu-0"' in done.content.decode()


def test_outsiders_see_none_of_it(client, charlie, charlies_project, cluster):
    client.force_login(charlie)
    assert client.get("/clusters/rlab/train/nodes/cpu-0/").status_code == 404
    assert client.post("/clusters/rlab/train/health/schedule/", {"every_hours": "1"}).status_code == 404
    api = api_client_for(charlie)
    for path in ("nodes/cpu-0/", "repairs/", "health/schedule/", "scans/"):
        assert api.get(API + path).status_code == 404


def test_with_slurmctld_killed_pages_keep_the_last_state_with_a_banner_and_nothing_is_repaired(
    rosa_web, rosa_api, cluster
):
    from clusters import processes
    from clusters.backends.local import daemons

    paths = get_backend("local").paths(cluster)
    assert synced(cluster) == ""
    last_known = sorted(cluster.compute_nodes().values_list("name", "slurm_state"))
    before = Operation.objects.filter(cluster=cluster).count()
    processes.stop(processes.find_pids("slurmctld", str(paths.conf)))
    try:
        for _ in range(3):  # three watch rounds (the beat runs one every 15 s): no repair storm
            assert repair.watch(cluster) is None
        assert Operation.objects.filter(cluster=cluster).count() == before
        assert "Slurm is not answering" in synced(cluster)
        nodes = rosa_web.get("/clusters/rlab/train/nodes/").content.decode()
        assert "Slurm not answering since" in nodes and "Showing the state as of" in nodes
        assert 'data-sync="failing"' in nodes
        for name, state in last_known:
            assert name in nodes and f">{state}<" in nodes
        assert sorted(cluster.compute_nodes().values_list("name", "slurm_state")) == last_known
        assert rosa_web.get("/clusters/rlab/train/").status_code == 200
        assert "Slurm is not answering" in rosa_api.get(API + "jobs/")["Warning"]
        assert Cluster.objects.get(pk=cluster.pk).status == ClusterStatus.READY
    finally:
        restarted = Cluster.objects.get(pk=cluster.pk)
        daemons.start_slurmctld(restarted, paths, get_backend("local").slurm(restarted))
    wait_until(lambda: synced(cluster) == "", timeout=60, message="Slurm to answer again")
    assert 'data-sync="fresh"' in rosa_web.get("/clusters/rlab/train/nodes/").content.decode()
    timeline = list(cluster.events.values_list("message", flat=True)[:5])
    assert any(m.startswith("Slurm answers again (it had not answered since") for m in timeline)
    assert any(m.startswith("Slurm is not answering") for m in timeline)
    assert repair.watch(cluster) is None  # back: still nothing to repair
    assert Operation.objects.filter(cluster=cluster).count() == before
