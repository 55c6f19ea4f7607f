"""Runs that warn early (recipes/runs/alerts.py): alice's run on the scripted backend logs a NaN loss,
stops logging, or slows down; each alert is an event and a banner once, and a NaN cancels the run
when its launch asked. The sync path that feeds it real metrics lines runs in test_recipes.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.services import create_cluster
from recipes.models import Run, RunMetric, RunStatus
from recipes.runs import alerts
from recipes.runs.launch import watch_options

from .conftest import provisioned, scripted_spec

pytestmark = pytest.mark.django_db
START = timezone.now() - timedelta(hours=1)


@pytest.fixture
def cluster(alpha, alice, scripted):
    operation = create_cluster(project=alpha, name="demo", spec=scripted_spec(), user=alice)
    provisioned(name="demo")
    return operation.cluster


@pytest.fixture
def run(cluster):
    return Run.objects.create(
        cluster=cluster, recipe_id="llama-tiny", profile="tiny", partition="cpu", nodes=1, steps=100, config={},
        script="", work_dir="/home/runs/x", status=RunStatus.RUNNING, slurm_job_id=7, started=START,
    )  # fmt: skip


def logged(run, *lines):
    """Store metrics lines as the sync does (non-finite numbers become gaps); the new rows."""
    first = run.metric_rows.count()
    rows = [
        RunMetric(run=run, line=first + i, step=line["step"], values=alerts.finite(line)[0])
        for i, line in enumerate(lines)
    ]
    RunMetric.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(metrics_seen=timezone.now())
    run.refresh_from_db()
    return rows


def line(step, loss=2.0, seconds_per_step=1.0):
    return {"step": step, "loss": loss, "tokens_per_s": 100.0, "time": START.timestamp() + step * seconds_per_step}


def test_a_nan_loss_is_stored_as_a_gap_and_alerts_once(run, scripted):
    rows = logged(run, line(1), line(2, loss=float("nan")), line(3, loss=float("inf")))
    assert rows[1].values["loss"] is None and rows[1].values["nonfinite"] == ["loss"]
    assert alerts.watch(run, rows) == [alerts.NONFINITE]
    assert run.alerts["nonfinite"]["message"] == "loss is not a finite number at step 2"
    assert run.cluster.events.filter(message="Run llama-tiny (job 7): loss is not a finite number at step 2").exists()
    assert alerts.watch(run, logged(run, line(4, loss=float("nan")))) == []  # once
    assert ("cancel", 7) not in scripted.calls  # the launch did not ask for it
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and set(run.alerts) == {"nonfinite"}


def test_a_nan_loss_cancels_the_run_when_its_launch_asked(run, scripted):
    Run.objects.filter(pk=run.pk).update(watch={"cancel_on_nonfinite": True})
    run.refresh_from_db()
    assert alerts.watch(run, logged(run, line(1, loss=float("nan")))) == [alerts.NONFINITE]
    assert ("cancel", 7) in scripted.calls
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.alerts["nonfinite"]["message"].endswith("; cancelling the run")


def test_a_run_that_stops_logging_alerts_after_its_stall_minutes(run, settings):
    settings.RUN_STALL_MINUTES = 30
    logged(run, line(1))
    seen = run.metrics_seen
    assert alerts.watch(run, [], now=seen + timedelta(minutes=29)) == []
    assert alerts.watch(run, [], now=seen + timedelta(minutes=31)) == [alerts.STALLED]
    assert run.alerts["stalled"]["message"] == "no metrics line for 31 minutes"
    started = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(watch={"stall_minutes": 5}, alerts={}, metrics_seen=None, started=started)
    run.refresh_from_db()
    # No line at all since the job started an hour ago.
    assert alerts.watch(run, []) == [alerts.STALLED]
    assert run.alerts["stalled"]["message"] == "no first metrics line for 60 minutes"


def test_a_run_that_slows_to_under_half_its_pace_alerts_and_a_steady_one_does_not(run):
    steady = logged(run, *(line(s) for s in range(1, 8)))
    assert alerts.watch(run, steady) == []
    # Step 8 comes 4 s after step 7 instead of 1 s: a quarter of the run's median pace.
    slow = logged(run, {**line(8), "time": line(7)["time"] + 4.0})
    assert alerts.watch(run, slow) == [alerts.SLOW]
    assert run.alerts["slow"]["message"] == "0.25 steps/s between its last two metrics lines, 25% of its median"


def probed(step, ms, nodes=("cpu-0", "cpu-0", "cpu-1", "cpu-1")):
    return {**line(step), "probe": {"ms": list(ms), "nodes": list(nodes)}}


def test_a_rank_slower_than_the_others_in_three_probes_running_names_its_node(run, alice, client):
    steady = [probed(s, [5.0, 5.2, 4.9, 5.1]) for s in (10, 20, 30)]
    assert alerts.watch(run, logged(run, *steady)) == []
    # cpu-1's second rank slows down: twice, then a normal probe, then three times in a row.
    assert alerts.watch(run, logged(run, probed(40, [5.0, 5.1, 5.0, 12.0]), probed(50, [5.0, 5.1, 5.0, 11.0]))) == []
    assert alerts.watch(run, logged(run, probed(60, [5.0, 5.1, 5.0, 5.3]))) == []  # one normal probe: no alert
    for step in (70, 80):
        assert alerts.watch(run, logged(run, probed(step, [5.0, 5.1, 5.0, 12.0]))) == []
    assert alerts.watch(run, logged(run, probed(90, [5.0, 5.2, 4.8, 15.0]))) == [alerts.STRAGGLER]
    message = run.alerts["straggler"]["message"]
    assert message.startswith("rank 3 on cpu-1 takes 3.0x as long as the other ranks for the same work (15.0 ms")
    event = run.cluster.events.get(message__contains="rank 3 on cpu-1")
    assert (event.node, event.level) == ("cpu-1", "WARNING")
    assert alerts.watch(run, logged(run, probed(100, [5.0, 5.1, 5.0, 12.0]))) == []  # once
    # The run page's banner says what it is and leads to the node's checks and repairs.
    client.force_login(alice)
    page = client.get(run.get_absolute_url()).content.decode()
    assert 'id="alert-straggler"><p><strong>A slow node:</strong> rank 3 on cpu-1' in page
    assert 'href="/clusters/alpha/demo/nodes/cpu-1/">cpu-1\'s checks and repairs</a>' in page


def test_with_two_ranks_the_slow_one_is_measured_against_the_other(run):
    lines = [probed(s, [4.0, 9.0], nodes=("a3-0", "a3-1")) for s in (10, 20, 30)]
    assert alerts.watch(run, logged(run, *lines)) == [alerts.STRAGGLER]
    assert "rank 1 on a3-1 takes 2.2x" in run.alerts["straggler"]["message"]


def test_a_slowdown_names_the_slowest_rank_when_the_probes_found_one(run):
    logged(run, *(probed(s, [5.0, 5.0, 5.0, 5.0]) for s in range(1, 8)))
    logged(run, *(probed(s, [5.0, 5.0, 5.0, 20.0]) for s in (8, 9)))
    slow = logged(run, {**probed(10, [5.0, 5.0, 5.0, 20.0]), "time": line(9)["time"] + 4.0})
    assert set(alerts.watch(run, slow)) == {alerts.SLOW, alerts.STRAGGLER}
    assert run.alerts["slow"]["message"].endswith("of its median; the slowest rank is 3 on cpu-1")


def test_probes_without_nodes_or_with_a_broken_value_raise_nothing(run):
    broken = [{**line(s), "probe": {"ms": [5.0, None], "nodes": ["a", "b"]}} for s in (1, 2, 3)]
    assert alerts.watch(run, logged(run, *broken)) == []
    assert alerts.slow_ranks({"ms": [5.0, 50.0]}) == []  # no nodes: nothing to name


def test_a_finished_run_raises_nothing(run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    run.refresh_from_db()
    assert alerts.watch(run, logged(run, line(1, loss=float("nan")))) == []


def test_the_launch_refuses_bad_watch_options_with_field_messages():
    errors = {}
    assert watch_options({"stall_minutes": "15", "cancel_on_nonfinite": "true"}, errors) == {
        "stall_minutes": 15,
        "cancel_on_nonfinite": True,
    }
    assert errors == {}
    watch_options({"stall_minutes": "0", "cancel_on_nonfinite": "maybe"}, errors)
    assert errors == {
        "stall_minutes": ["must be a whole number of minutes from 1 to 1440"],
        "cancel_on_nonfinite": ["must be true or false"],
    }


def test_a_nan_line_as_train_py_writes_it_is_stored_and_read_back(run):
    import json

    # json.dumps writes NaN, which Python reads back but PostgreSQL's jsonb refuses ("Token NaN is
    # invalid"): the sync stores the line with gaps (this module runs on PostgreSQL in scripts/test.sh).
    record = json.loads(json.dumps({"step": 3, "loss": float("nan"), "lr": 0.001}))
    RunMetric.objects.create(run=run, line=0, step=3, values=alerts.finite(record)[0])
    assert RunMetric.objects.get(run=run).values == {"step": 3, "loss": None, "lr": 0.001, "nonfinite": ["loss"]}


def test_the_run_page_shows_the_runs_own_lines_and_the_whole_tail_on_request(client, alice, run):
    """A 4-rank run's tail was mostly library warnings, four copies each; the page now shows the
    training lines and errors (a line every rank printed, once with its count), and the full tail a
    click away, polled the same way."""
    tail = "\n".join([
        "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py:3204: FutureWarning: `x` is deprecated.",
        "  warnings.warn(",
        *["[rank2]:W1206 16:26:11.331000 21390 torch/distributed/tensor/_redistribute.py:390] While redistributing"]
        * 4,
        "[train] step 2 loss 5.2118 tokens/s 2207.0",
        *["[transformers] Setting `use_cache=False`."] * 4,
        "Writing model shards:   0%|          | 0/1 [00:00<?, ?it/s]",
        "Traceback (most recent call last):",
        "RuntimeError: CUDA out of memory on rank 3 " + "x" * 300,
    ])  # fmt: skip
    Run.objects.filter(pk=run.pk).update(log_tail=tail)
    client.force_login(alice)
    page = client.get(run.get_absolute_url()).content.decode()
    shown = page[page.index('id="log-tail"') :]
    shown = shown[: shown.index("</pre>")]
    assert "FutureWarning" not in shown and "While redistributing" not in shown and "model shards" not in shown
    assert "[train] step 2 loss 5.2118" in shown and "Traceback" in shown and "x" * 300 in shown
    assert "[transformers] Setting `use_cache=False`.  (x4)" in shown
    full = client.get(run.get_absolute_url() + "?log=full").content.decode()
    assert "FutureWarning" in full and full.count("While redistributing") == 4
    assert "live/?log=full" in full  # the polled part keeps the choice
    assert 'pre class="json log"' in page  # wrapped, not cut off (static/console/console.css)


def test_the_run_page_charts_its_slowest_rank_against_the_others(client, alice, run):
    """The probes as a chart by step (the largest ratio of one rank to the others' median); a run without
    probes (one rank) has no such chart."""
    client.force_login(alice)
    logged(run, line(1), line(2))
    assert 'id="probe-chart"' not in client.get(run.get_absolute_url()).content.decode()
    logged(run, probed(10, [5.0, 5.0, 5.0, 5.0]), probed(20, [5.0, 5.0, 5.0, 10.0]), probed(30, [5.0, 5.0, 5.0, 15.0]))
    page = client.get(run.get_absolute_url()).content.decode()
    assert 'id="probe-chart"' in page
    assert "Slowest rank against the other ranks. probe time / others&#x27; median: 3 points from step 10 to " in page
    assert "last 3 x, lowest 1 x, highest 3 x" in page
