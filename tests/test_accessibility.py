"""Every page, read by axe-core (axe-playwright-python's bundled axe 4.x) in Debian's chromium: no serious
or critical violation of WCAG 2.1 A/AA or axe's best practices. Persona: alice, whose project alpha has a
READY cluster with a run, a model version and an endpoint; the pages show her data, not only their empty
states (those are checked too: the dashboard and the lists before anything exists)."""

import os
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.choices import ClusterStatus, NodeRole
from clusters.models import Cluster, HealthResult, Node, NodePool, Operation

from .conftest import example_spec
from .factories import start_step_by_step

pytestmark = pytest.mark.django_db(transaction=True)

SERIOUS = ("serious", "critical")


def seed(alpha, tmp_path, in_mlflow=False):
    """alpha/demo READY with two nodes, scans, two runs with metrics, two model versions (one from a run) and an
    endpoint with traffic."""
    from recipes import registry
    from recipes.models import Endpoint, EndpointSample, ModelVersion, Run, RunMetric, RunStatus

    from .factories import a_version

    cluster = Cluster.objects.create(
        project=alpha, name="demo", spec=example_spec(), status=ClusterStatus.READY, backend="local"
    )
    login = NodePool.objects.create(cluster=cluster, pool_id="login", role=NodeRole.LOGIN, machine_type="local",
                                    node_count=1)  # fmt: skip
    pool = NodePool.objects.create(cluster=cluster, pool_id="cpu", machine_type="local", node_count=1)
    Node.objects.create(cluster=cluster, node_pool=login, name="login-0", index=0, state="READY")
    Node.objects.create(cluster=cluster, node_pool=pool, name="cpu-0", index=0, state="READY", slurm_state="idle")
    scan = Operation.objects.create(cluster=cluster, kind="SCAN", status="SUCCEEDED")
    for hours_ago, gflops in ((2, 40.0), (1, 42.5)):
        earlier = Operation.objects.create(cluster=cluster, kind="SCAN", status="SUCCEEDED")
        HealthResult.objects.create(operation=earlier, cluster=cluster, node="cpu-0", check_name="speed",
                                    status="pass", values={"gflops": gflops},
                                    created=timezone.now() - timedelta(hours=hours_ago))  # fmt: skip
    HealthResult.objects.create(operation=scan, cluster=cluster, node="cpu-0", check_name="disk", status="pass",
                                latest=True)  # fmt: skip
    runs = []
    for steps in (20, 12):
        run = Run.objects.create(cluster=cluster, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                                 nodes=1, steps=40, config={}, script="#!/bin/bash\n", work_dir="/home/runs/x",
                                 status=RunStatus.RUNNING, slurm_job_id=7)  # fmt: skip
        for step in range(1, steps + 1):
            values = {"step": step, "loss": 9.0 / step, "lr": 1e-4, "tokens_per_s": 600.0 + step, "time": step}
            RunMetric.objects.create(run=run, line=step, step=step, values=values)
        runs.append(run)
    model = f"llama-{uuid.uuid4().hex[:6]}"
    if in_mlflow:
        # Two versions in the real MLflow (a fresh model name per test: MLflow outlives the tests' database),
        # the second continued from the first and aliased production.
        first = a_version(alpha, model, tmp_path, losses=(3.1, 2.4, 1.9, 1.7))
        a_version(alpha, model, tmp_path, losses=(1.7, 1.5, 1.38, 1.31), parent=first, lr="0.0005")
        registry.set_alias(alpha, model, "production", 2)
    else:  # the pages that do not read MLflow: the versions' rows alone
        first = ModelVersion.objects.create(project=alpha, name=model, version=1, family="llama", checkpoint="x",
                                            step=4, final_loss=1.7)  # fmt: skip
        ModelVersion.objects.create(project=alpha, name=model, version=2, family="llama", checkpoint="y", step=4,
                                    final_loss=1.31, parent=first)  # fmt: skip
    ModelVersion.objects.filter(pk=first.pk).update(run=runs[0], recipe_id=runs[0].recipe_id, cluster_name="demo")
    endpoint = Endpoint.objects.create(project=alpha, cluster=cluster, name="chat", model_name=model, version=2,
                                       created=timezone.now() - timedelta(minutes=30))  # fmt: skip
    for seconds_ago in range(300, 0, -10):
        EndpointSample.objects.create(endpoint=endpoint, time=timezone.now() - timedelta(seconds=seconds_ago),
                                      seconds=5, requests=20, p50_ms=40, p95_ms=95, replicas=1)  # fmt: skip
    return {
        "run": runs[0].get_absolute_url(),
        "compare": f"?run={runs[0].uuid}&run={runs[1].uuid}",
        "scan": scan.uuid,
        "model": model,
    }


PAGES = {
    "dashboard": "/",
    "new cluster (JSON)": "/clusters/new/",
    "wizard": "/clusters/wizard/",
    "cluster": "/clusters/alpha/demo/",
    "node": "/clusters/alpha/demo/nodes/cpu-0/",
    "health scan": "/clusters/alpha/demo/scans/{scan}/",
    "launch a recipe": "/clusters/alpha/demo/runs/new/",
    "run": "{run}",
    "compare runs": "/clusters/alpha/demo/runs/compare/{compare}",
    "models": "/models/",
    "model": "/models/alpha/{model}/",
    "version": "/models/alpha/{model}/v2/",
    "compare versions": "/models/alpha/{model}/compare/?a=1&b=2",
    "endpoints": "/endpoints/",
    "new endpoint": "/endpoints/new/",
    "endpoint": "/endpoints/alpha/chat/",
    "API tokens": "/tokens/",
}


def serious(tab):
    from axe_playwright_python.sync_playwright import Axe

    # No htmx swap while axe reads the page (the live parts poll every few seconds): its requests are
    # cancelled from here on.
    tab.evaluate("document.body.addEventListener('htmx:beforeRequest', (event) => event.preventDefault())")
    results = Axe().run(tab)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — " + "; ".join(n["target"][0] for n in v["nodes"][:5])
        for v in results.response["violations"]
        if v["impact"] in SERIOUS
    ]


READ_MLFLOW = {"model", "version", "compare versions"}  # pages that read the registry's versions from MLflow
# `bash scripts/screenshots.sh` sets TCC_SCREENSHOTS: these pages are then saved there as PNGs as well
# (docs/screenshots/, what the docs show).
SCREENSHOTS = {"dashboard", "cluster", "node", "run", "compare runs", "model", "version", "endpoint"}


@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_no_serious_accessibility_violation(page, live_server, alpha, name, mlflow_server, tmp_path):
    urls = seed(alpha, tmp_path, in_mlflow=name in READ_MLFLOW)
    response = page.goto(live_server.url + PAGES[name].format(**urls))
    assert response.status == 200, response.status
    page.wait_for_load_state("networkidle")
    if os.environ.get("TCC_SCREENSHOTS") and name in SCREENSHOTS:
        if page.locator("figure[data-chart]").count():
            page.locator("figure[data-chart][data-drawn]").first.wait_for()
        page.screenshot(path=f"{os.environ['TCC_SCREENSHOTS']}/{name.replace(' ', '-')}.png", full_page=True)
    found = serious(page)
    assert not found, "\n".join(found)


def test_every_wizard_step_has_none(page, live_server):
    from clusters.wizard import STEPS

    start_step_by_step(page, live_server, cluster_id="a11y")
    for step, _ in STEPS:
        page.goto(f"{live_server.url}/clusters/alpha/a11y/wizard/{step}/")
        found = serious(page)
        assert not found, f"{step}: " + "\n".join(found)


def test_the_empty_states_and_the_sign_in_page_have_none_either(page, live_server, browser):
    for path in ("/", "/models/", "/endpoints/"):
        page.goto(live_server.url + path)
        page.wait_for_load_state("networkidle")
        assert serious(page) == [], path
    anonymous = browser.new_context().new_page()
    anonymous.goto(f"{live_server.url}/accounts/login/")
    assert serious(anonymous) == []
    anonymous.context.close()
