"""The wizards in a real browser: Playwright drives Debian's chromium against the live server.

A real Celery worker provisions the cluster the reference path creates, on a real local Slurm.
"""

import pytest

from clusters.choices import ClusterStatus
from clusters.models import Cluster

from .factories import start_step_by_step

pytestmark = pytest.mark.django_db(transaction=True)


def test_alice_reaches_a_ready_cluster_from_a_reference_architecture(page, live_server, celery_worker, slurm):
    page.goto(f"{live_server.url}/clusters/wizard/")
    form = page.locator("#reference-form")
    form.get_by_label("CPU only (n2)").check()
    form.get_by_label("Cluster id").fill("refcpu")
    form.get_by_label("Display name").fill("refcpu")
    form.get_by_label("Worker nodes").fill("2")
    form.get_by_role("button", name="Continue to review").click()
    page.wait_for_url("**/wizard/review/")
    assert page.locator("#plan code", has_text="cpu-1").is_visible()
    page.get_by_role("button", name="Create cluster").click()
    page.wait_for_url(f"{live_server.url}/clusters/alpha/refcpu/")
    # htmx polls the operation and swaps the status badge in when it changes.
    page.locator("#cluster-status", has_text="Ready").wait_for(timeout=90_000)
    assert page.locator(".progress-label .pct").text_content() == "100%"
    # The worker's beat syncs Slurm's node states into the database every 2 s here and the nodes
    # table polls every 5 s; wait for the poll that shows both nodes idle, as of a recent sync.
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect(page.locator("#nodes-list tbody .badge", has_text="idle")).to_have_count(2, timeout=20_000)
    assert page.locator("#nodes-list .sync-state").text_content().strip().startswith("As of")
    # The first scan's jobs are in the jobs list; typing in the filter narrows it in place.
    sync_api.expect(page.locator("#jobs-list tr[data-job]").first).to_be_visible(timeout=20_000)
    page.get_by_label("Job id or name").fill("no-such-job")
    page.locator("#jobs-list", has_text="No job matches these filters").wait_for()
    page.get_by_label("Job id or name").fill("")
    sync_api.expect(page.locator("#jobs-list tr[data-job]").first).to_be_visible()
    assert Cluster.objects.get(name="refcpu").status == ClusterStatus.READY
    # The periodic scan's form answers a bad value in place (htmx swaps the 400) and keeps the input.
    schedule = page.locator("#schedule")
    schedule.get_by_label("hours between scans").fill("soon")
    schedule.get_by_role("button", name="Save schedule").click()
    page.locator("#schedule .field-error", has_text="must be a number of hours").wait_for()
    assert page.locator("#schedule").get_by_label("hours between scans").input_value() == "soon"
    page.locator("#schedule").get_by_label("hours between scans").fill("2")
    page.locator("#schedule").get_by_role("button", name="Save schedule").click()
    page.locator("#schedule", has_text="Saved.").wait_for()
    assert Cluster.objects.get(name="refcpu").health_schedule.every_minutes == 120


def test_a_bad_value_shows_an_inline_error_until_it_is_fixed(page, live_server):
    start_step_by_step(page, live_server)
    page.get_by_label("Display name").fill("Bad Name")
    error = page.locator("#err-display_name")
    error.filter(has_text="lowercase letters or digits").wait_for()
    page.get_by_label("Display name").fill("good1")
    page.wait_for_function("document.getElementById('err-display_name').textContent === ''")
    page.get_by_role("button", name="Next: Compute").click()
    page.wait_for_url("**/wizard/compute/")
    assert Cluster.objects.get(name="steps").spec["display_name"] == "good1"


def test_a_reload_in_the_middle_keeps_the_draft(page, live_server):
    start_step_by_step(page, live_server)
    page.goto(f"{live_server.url}/clusters/alpha/steps/wizard/compute/")
    nodes = page.locator("input[name='pool-1-count']")
    nodes.fill("3")
    page.wait_for_function("() => true", polling=100)  # let the debounced live check fire
    page.wait_for_timeout(1000)
    page.reload()
    assert page.locator("input[name='pool-1-count']").input_value() == "3"
    second_tab = page.context.new_page()
    second_tab.goto(f"{live_server.url}/clusters/alpha/steps/wizard/review/")
    assert "cpu-2" in second_tab.locator("#plan").text_content()
    second_tab.close()


def test_alice_can_complete_a_step_with_the_keyboard_alone(page, live_server):
    start_step_by_step(page, live_server)
    page.get_by_label("Cluster id").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "display_name"
    page.keyboard.press("Control+A")
    page.keyboard.type("keys1")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "zone"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "backend"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent").startswith("Next")
    page.keyboard.press("Enter")
    page.wait_for_url("**/wizard/compute/")
    assert Cluster.objects.get(name="steps").spec["display_name"] == "keys1"


def test_charts_are_drawn_with_their_axes_and_switch_to_a_log_scale(page, live_server, alice, alpha):
    """uPlot draws the run page's charts (a canvas per chart, its legend in four figures); the log-scale
    switch redraws the loss and survives the page's polling, which swaps the charts in again."""
    from recipes.models import Run, RunMetric, RunStatus

    from .conftest import example_spec

    cluster = Cluster.objects.create(project=alpha, name="charts", spec=example_spec(), status=ClusterStatus.READY)
    run = Run.objects.create(cluster=cluster, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                             nodes=1, steps=100, config={}, script="", work_dir="/home/runs/x",
                             status=RunStatus.RUNNING)  # fmt: skip
    for step in range(1, 21):
        values = {"step": step, "loss": 10.0 / step, "lr": 1e-4 * step, "tokens_per_s": 600.0 + step, "time": step}
        RunMetric.objects.create(run=run, line=step, step=step, values=values)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{live_server.url}{run.get_absolute_url()}")
    for chart_id in ("loss-chart", "lr-chart", "throughput-chart"):
        page.locator(f"#{chart_id} canvas").wait_for()
        assert page.locator(f"#{chart_id}").get_attribute("data-drawn") == "true"
    assert "tokens/s" in page.locator("#throughput-chart .u-legend").text_content()
    page.locator("#loss-chart input[data-log]").check()
    page.wait_for_function("document.querySelector('#loss-chart')._chart.scales.y.distr === 3")
    page.evaluate("window.drawnBefore = document.querySelector('#loss-chart')")
    # The run page polls every 2 s: a new figure is swapped in, drawn again with the reader's choice.
    page.wait_for_function("(f => f !== window.drawnBefore && f._chart)(document.querySelector('#loss-chart'))")
    assert page.evaluate("document.querySelector('#loss-chart')._chart.scales.y.distr") == 3
    assert page.locator("#loss-chart input[data-log]").is_checked()
    assert errors == []
