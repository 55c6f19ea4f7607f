"""Charts: what the server hands uPlot (console/charts.py) and the pages that show them. Personas: alice
runs "alpha/demo"; charlie is in another project. The browser draws them in tests/test_browser.py."""

import json
import math
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.charts import MAX_POINTS, chart, overlay


def test_it_leaves_missing_and_non_finite_values_as_gaps():
    rows = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": math.nan}, {"step": 3}, {"step": 4, "loss": 1.5}]
    found = chart("loss-chart", "Training loss", rows, {"loss": "loss"})
    assert found.xs == [1, 2, 3, 4]
    assert found.series[0]["values"] == [2.0, None, None, 1.5]  # never a line drawn through them
    assert found.series[0]["span"] is False


def test_it_breaks_the_line_where_no_sample_was_taken():
    """p50/p95 were drawn as one straight line across periods with no samples."""
    rows = [{"time": 0, "p50_ms": 10}, {"time": 5, "p50_ms": 12}, {"time": 300, "p50_ms": 30}]
    found = chart("latency", "Latency", rows, {"p50_ms": "p50"}, x="time", unit="ms", gap=10)
    assert found.series[0]["values"] == [10, 12, None, 30]


def test_it_needs_two_values_to_draw_anything():
    assert chart("loss-chart", "Training loss", [{"step": 1, "loss": 2.0}, {"step": 2}], {"loss": "loss"}) is None


def test_it_averages_a_long_series_down_to_what_a_chart_can_show():
    rows = [{"step": i, "loss": float(i % 2)} for i in range(1, 3001)]
    found = chart("loss-chart", "Training loss", rows, {"loss": "loss"})
    assert len(found.xs) == len(found.series[0]["values"]) <= MAX_POINTS
    assert found.xs[-1] == 3000 and found.series[0]["values"][0] == 0.6  # steps 1-5 averaged


def test_the_summary_reads_the_chart_in_four_figures():
    """Values like "680.311" beside captions like "s 155" said little; a screen reader gets a sentence."""
    rows = [{"step": 1, "tokens_per_s": 512.0}, {"step": 2, "tokens_per_s": 680.3114}]
    found = chart("throughput-chart", "Throughput", rows, {"tokens_per_s": "tokens/s"}, unit="tokens/s")
    assert found.summary == (
        "Throughput. tokens/s: 2 points from step 1 to step 2, last 680.3 tokens/s, lowest 512 tokens/s, "
        "highest 680.3 tokens/s."
    )


def test_it_overlays_runs_on_their_common_steps():
    found = overlay(
        "compare-chart",
        "Training loss",
        {"a": [{"step": 1, "loss": 3.0}, {"step": 3, "loss": 2.0}], "b": [{"step": 2, "loss": 2.5}]},
        "loss",
        log=True,
    )
    assert found.xs == [1, 2, 3]
    assert [s["values"] for s in found.series] == [[3.0, None, 2.0], [None, 2.5, None]]
    assert all(s["span"] for s in found.series) and found.log  # a run's own points are joined


# -- pages -------------------------------------------------------------------------------------------


def chart_data(html, chart_id):
    """The JSON a page hands charts.js for one chart."""
    figure = html.split(f'id="{chart_id}"', 1)[1].split("</figure>", 1)[0]
    return json.loads(re.search(r'<script type="application/json">(.*?)</script>', figure, re.S).group(1))


def a_run(cluster, steps=3, **fields):
    from recipes.models import Run, RunMetric, RunStatus

    run = Run.objects.create(cluster=cluster, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                             nodes=1, steps=10, config={}, script="", work_dir="/home/runs/x",
                             status=RunStatus.RUNNING, **fields)  # fmt: skip
    for step in range(1, steps + 1):
        values = {"step": step, "loss": 3.0 / step, "lr": 1e-3 * step, "tokens_per_s": 500.0 + step, "time": step}
        RunMetric.objects.create(run=run, line=step, step=step, values=values)
    return run


@pytest.mark.django_db
def test_a_runs_page_charts_loss_learning_rate_and_tokens_per_second(alice_web, demo):
    run = a_run(demo)
    html = alice_web.get(run.get_absolute_url()).content.decode()
    for chart_id in ("loss-chart", "lr-chart", "throughput-chart"):
        assert f'id="{chart_id}"' in html
    assert chart_data(html, "loss-chart")["series"][0]["values"] == [3.0, 1.5, 1.0]
    assert chart_data(html, "throughput-chart")["unit"] == "tokens/s"
    assert "log scale" in html.split('id="loss-chart"', 1)[1].split("</figure>")[0]
    assert "Training loss. loss: 3 points from step 1 to step 3, last 1, lowest 1, highest 3." in html


@pytest.mark.django_db
def test_alice_overlays_two_runs_and_a_bad_pick_is_a_form_error(alice_web, demo, client, charlie, charlies_project):
    first, second = a_run(demo), a_run(demo, steps=5)
    url = f"/clusters/alpha/demo/runs/compare/?run={first.uuid}&run={second.uuid}&metric=loss"
    response = alice_web.get(url)
    assert response.status_code == 200
    data = chart_data(response.content.decode(), "compare-chart")
    assert data["xs"] == [1, 2, 3, 4, 5] and len(data["series"]) == 2
    assert data["series"][0]["values"][3:] == [None, None]  # the shorter run stops at its last step

    alone = alice_web.get(f"/clusters/alpha/demo/runs/compare/?run={first.uuid}")
    assert alone.status_code == 400 and "Pick at least two runs" in alone.content.decode()
    bad = alice_web.get(f"/clusters/alpha/demo/runs/compare/?run={first.uuid}&run=nonsense&metric=gpu")
    text = bad.content.decode()
    assert bad.status_code == 400 and "Pick runs of this cluster" in text and "Pick one of: loss, lr" in text
    assert f'value="{first.uuid}" id="run-{first.uuid}" checked' in text  # the pick is kept
    empty = alice_web.get("/clusters/alpha/demo/runs/compare/")
    assert empty.status_code == 200 and "Tick two or more runs" in empty.content.decode()

    client.force_login(charlie)
    assert client.get(url).status_code == 404


@pytest.mark.django_db
def test_an_endpoints_traffic_has_a_time_axis_a_window_and_gaps_where_nothing_was_sampled(alice_web, demo):
    from recipes.models import Endpoint, EndpointSample

    endpoint = Endpoint.objects.create(project=demo.project, cluster=demo, name="chat", model_name="llama", version=1)
    now = timezone.now()
    for minutes_ago in (50, 49, 3, 2):
        EndpointSample.objects.create(endpoint=endpoint, time=now - timedelta(minutes=minutes_ago), seconds=5,
                                      requests=60, p50_ms=40, p95_ms=90, replicas=1)  # fmt: skip
    html = alice_web.get("/endpoints/alpha/chat/").content.decode()
    assert '<a href="?window=1h" aria-current="true">1h</a>' in html  # the default window
    latency = chart_data(html, "latency")
    assert latency["x"] == "time" and latency["unit"] == "ms"
    assert [s["label"] for s in latency["series"]] == ["p50", "p95"]
    p50 = latency["series"][0]["values"]
    assert p50.count(40) == 4 and None in p50[p50.index(40) : len(p50) - p50[::-1].index(40)]  # a gap between
    assert abs(latency["xs"][0] - (now - timedelta(hours=1)).timestamp()) < 30

    short = alice_web.get("/endpoints/alpha/chat/live/?window=15m").content.decode()
    assert chart_data(short, "latency")["series"][0]["values"].count(40) == 2  # the 50-minute-old samples are out
    assert '<a href="?window=15m" aria-current="true">' in short
    assert (
        '<a href="?window=1h" aria-current="true">'
        in alice_web.get("/endpoints/alpha/chat/?window=9y").content.decode()
    )
