"""The examples in README.md and docs/*.md are tests: every code block with a curl command runs as
written, in bash from the checkout, against a live console (a real Celery worker, a real local Slurm)
or the router in front of a real replica, and so does every Python block. Only the addresses change
(the console's 127.0.0.1:8000 and the router's 127.0.0.1:8100 become the test servers') and TOKEN
comes from the environment; each request must answer 2xx (curl --fail-with-body) and each block exit 0.

The docs' example in docs/endpoints.md once deployed `alias: production` of a model no run registered,
and README's polled a placeholder OPERATION_ID: an example that cannot run as written fails here.
Persona: alice, admin of the project `default` the docs use (scripts/console.sh makes it)."""

import asyncio
import os
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings

from clusters.choices import ClusterStatus, Role
from clusters.models import Cluster, Project
from console.models import APIToken
from recipes.models import Run

from .conftest import REPLICA_TOKEN, stop_local_clusters

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(settings.BASE_DIR)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONSOLE, ROUTER = "http://127.0.0.1:8000", "http://127.0.0.1:8100"


def code_blocks(text):
    """The Markdown file's indented code blocks, dedented, in order."""
    found, current, previous_blank = [], None, True
    for line in text.split("\n"):
        if line.startswith("    ") and (current is not None or previous_blank):
            current = (current or []) + [line[4:]]
        elif current is not None and not line.strip():
            current.append("")
        elif current is not None:
            found.append("\n".join(current).strip("\n"))
            current = None
        previous_blank = not line.strip()
    if current is not None:
        found.append("\n".join(current).strip("\n"))
    return found


def examples():
    """[(file name, "shell" or "python", block)] of every runnable example, in the docs' order."""
    found = []
    for path in DOCS:
        for block in code_blocks(path.read_text()):
            if re.search(r"(^|\$\()curl ", block, re.MULTILINE):
                found.append((path.name, "shell", block))
            elif block.startswith(("import ", "from ")):
                found.append((path.name, "python", block))
    return found


def run(kind, block, token, console=CONSOLE, router=ROUTER, timeout=240):
    text = block.replace(CONSOLE, console).replace(ROUTER, router)
    text = re.sub(r"^TOKEN=tcc_\.\.\.$", "# TOKEN: the test's", text, flags=re.MULTILINE)  # the docs' placeholder
    if kind == "shell":
        script = 'set -euo pipefail\ncurl() { command curl --fail-with-body --max-time 60 "$@"; }\n' + text
        command = ["bash", "-c", script]
    else:
        command = [sys.executable, "-c", text]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "TOKEN": token}, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{block}\n-- exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture
def token(alice):
    project = Project.objects.create(slug="default", name="Default", gcp_project_id="tcc-docs")
    project.members.add(alice, through_defaults={"role": Role.ADMIN})
    return APIToken.issue(alice, "docs examples")[1]


def test_the_examples_are_found():
    """The extraction cannot pass by finding nothing: the blocks the docs are known to have."""
    kinds = {(name, kind) for name, kind, _ in examples()}
    assert {("README.md", "shell"), ("recipes.md", "shell"), ("endpoints.md", "shell")} <= kinds
    assert ("endpoints.md", "python") in kinds
    assert not [b for _, _, b in examples() if re.search(r"OPERATION_ID|http://ROUTER|curl \.\.\.", b)]


def test_the_consoles_examples_run_as_written(live_server, celery_worker, slurm, token):
    """README's: create the cluster from examples/cluster-local-cpu.json, poll it to READY, create one by
    the service's own path from examples/service-create-a3ultra.json and poll its operation; then
    docs/recipes.md launches a recipe on that cluster."""
    try:
        for _, kind, block in examples():
            if ROUTER not in block:
                run(kind, block, token, console=live_server.url)
                if "until curl" in block:  # README's poll ends on READY or FAILED: it must be READY
                    demo = Cluster.objects.get(project__slug="default", name="demo")
                    assert demo.status == ClusterStatus.READY, demo.status_message
        runs = Run.objects.filter(cluster__name="demo")
        assert [(r.recipe_id, r.nodes, r.steps) for r in runs] == [("llama3.1-8b-pretrain", 2, 60)]  # recipes.md's
        assert Cluster.objects.filter(project__slug="default", name="a3u").exists()  # README's v1beta1 create
    finally:
        stop_local_clusters()


@contextmanager
def router_serving(project, replica_url):
    """The router (recipes/serving/router.py) on a port of its own in a thread, its table holding the
    endpoint `chat` of `project` on the replica, serving llama-tiny v3 (the docs' names)."""
    from aiohttp import web

    from recipes.serving import router as routing

    loop = asyncio.new_event_loop()
    app = routing.application()
    app.on_startup.clear()

    async def startup(app):
        router = app[routing.ROUTER]
        await routing.Router.start(router, app)
        for task in app[routing.TASKS]:
            task.cancel()  # no table from the database, no probes: the table below
        names = ("chat", "llama-tiny:v3", "llama-tiny@production")
        replicas = [(1, replica_url, "llama-tiny:v3", REPLICA_TOKEN)]
        router.routes = {("default", "chat"): routing.Route(1, project.pk, replicas, "llama-tiny:v3", "chat", names)}

    app.on_startup.append(startup)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_the_routers_examples_run_as_written(token, replica):
    """docs/endpoints.md: completions, chat completions, the models list and :predict with curl, and a
    streamed completion with the official openai client."""
    project = Project.objects.get(slug="default")
    with router_serving(project, replica) as router:
        outputs = [run(kind, block, token, router=router) for _, kind, block in examples() if ROUTER in block]
    assert len(outputs) == 2
    curl, streamed = outputs
    assert '"object":"list"' in curl.replace(" ", "") and '"predictions"' in curl
    assert streamed.strip()  # the tokens the stream printed
