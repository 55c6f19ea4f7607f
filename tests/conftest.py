"""Personas, API clients and the real services (Redis, Celery worker, Slurm) the tests use.

alice and bob are members of project "alpha"; charlie is an outsider with a project of his own.

Test tiers are decided here, not by hand: a test whose fixtures include `slurm` is marked `slurm`,
one whose fixtures include `redis_broker` (every Celery worker needs it) is marked `worker`, and a
test that starts Slurm daemons without being marked fails. `pytest -m "not slurm and not worker"`
is the fast loop (no daemon, no broker).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from clusters import processes, services
from clusters.choices import ClusterStatus, Role
from clusters.models import Cluster, Operation, Project
from clusters.operations import engine
from console.models import APIToken

EXAMPLE = Path(settings.BASE_DIR) / "examples" / "cluster-local-cpu.json"


def example_spec(**pool_counts):
    """The shipped example spec, with node counts per pool id changed as asked."""
    import json

    spec = json.loads(EXAMPLE.read_text())
    for pool in spec["node_pools"]:
        if pool["id"] in pool_counts:
            n = pool_counts[pool["id"]]
            pool["scaling_spec"] = {"min_node_count": n, "max_node_count": n}
    return spec


@pytest.fixture
def scripted(settings):
    """A fresh ScriptedBackend (tests/backends.py) registered as "scripted" for this test only."""
    from clusters import backends

    settings.CLUSTER_BACKENDS = {**settings.CLUSTER_BACKENDS, "scripted": "tests.backends.ScriptedBackend"}
    backends.forget()
    yield backends.get_backend("scripted")
    backends.forget()


def scripted_spec(**pool_counts):
    spec = example_spec(**pool_counts)
    spec["console"]["backend"] = "scripted"
    return spec


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.com", "alice-password")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.com", "bob-password")


@pytest.fixture
def charlie(django_user_model):
    return django_user_model.objects.create_user("charlie", "charlie@example.com", "charlie-password")


@pytest.fixture
def alpha(alice, bob):
    project = Project.objects.create(slug="alpha", name="Alpha")
    project.members.add(alice, bob, through_defaults={"role": Role.ADMIN})
    return project


@pytest.fixture
def charlies_project(charlie):
    project = Project.objects.create(slug="charlie-lab", name="Charlie's lab")
    project.members.add(charlie, through_defaults={"role": Role.ADMIN})
    return project


@pytest.fixture
def alice_web(client, alice, alpha):
    """alice, signed in to the pages."""
    client.force_login(alice)
    return client


@pytest.fixture
def demo(alice, alpha):
    """alpha/demo, created (its provisioning not run: no worker)."""
    return services.create_cluster(project=alpha, name="demo", spec=example_spec(), user=alice).cluster


def submit_through_slurmrestd(api, url, script, **job):
    """Submit `script` as the api's user through the service's :callSlurmRestApi at `url` (partition
    cpu, 5 minutes and a plain PATH unless `job` says otherwise); Slurm's answer."""
    job = {"partition": "cpu", "time_limit": 5, "environment": {"PATH": "/usr/bin:/bin"}, **job}
    submit = {"method": "HTTP_METHOD_POST", "path": "/slurm/v0.0.38/job/submit", "body": {"script": script, "job": job}}
    response = api.post(url, submit, format="json")
    assert response.json()["status_code"] == 200, response.content
    return response.json()["body"]


def provisioned(**cluster_filters):
    """Clusters as if their create had finished (without a worker): READY, their operations done."""
    from clusters.choices import OperationStatus

    clusters = Cluster.objects.filter(**cluster_filters)
    Operation.objects.filter(cluster__in=clusters).update(status=OperationStatus.SUCCEEDED)
    clusters.update(status=ClusterStatus.READY)


def api_client_for(user):
    client = APIClient()
    _token, raw = APIToken.issue(user, "tests")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def alice_api(alice, alpha):
    return api_client_for(alice)


@pytest.fixture
def bob_api(bob, alpha):
    return api_client_for(bob)


@pytest.fixture
def charlie_api(charlie, charlies_project):
    return api_client_for(charlie)


# -- real services ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_broker():
    """The real Redis the worker uses; its test database is emptied first."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        where = client.connection_pool.connection_kwargs  # the URL itself holds the password
        pytest.fail(f"Redis is not running at {where.get('host')}:{where.get('port')}; start it (scripts/test.sh does)")
    except redis.AuthenticationError:
        pytest.fail(f"Redis refused the password in {settings.REDIS_PASSWORD_FILE}; scripts/bootstrap.sh sets both")
    purge_queue(client)
    return client


def purge_queue(client):
    """Drop this checkout's pending tasks (its own queues; another checkout's tests may share Redis) and the
    keys that say a periodic round waits (console/rounds.py), which would hold the next ones back."""
    client.delete(settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_PERIODIC_QUEUE)
    waiting = list(client.scan_iter(f"{settings.CELERY_PERIODIC_QUEUE}:waiting:*"))
    if waiting:
        client.delete(*waiting)


class Worker:
    """A real `celery worker` process on the test settings and test database; with beat=True it also
    runs Celery beat (the periodic tasks: Slurm sync, watch, scans), as scripts/console.sh does."""

    def __init__(self, log_path, beat=False, **env):
        self.log_path = log_path
        worker_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "console.settings_test",
            "CONSOLE_WORKER_USES_TEST_DB": "1",
            "LOCAL_CLUSTERS_DIR": str(settings.LOCAL_CLUSTERS_DIR),
            "TEST_REDIS_URL": settings.REDIS_URL,
            **{k: str(v) for k, v in env.items()},
        }
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "console",
                "worker",
                "--pool=solo",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                f"--queues={settings.CELERY_TASK_DEFAULT_QUEUE},{settings.CELERY_PERIODIC_QUEUE}",
                f"--hostname=test-{uuid.uuid4().hex[:8]}@%h",
                *(["--beat", f"--schedule={Path(log_path).parent / 'beat-schedule'}"] if beat else []),
            ],
            env=worker_env,
            cwd=settings.BASE_DIR,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        with suppress(AssertionError):
            wait_until(
                lambda: "ready." in Path(log_path).read_text() or self.process.poll() is not None,
                timeout=60,
                message="the celery worker to start",
            )
        if self.process.poll() is not None or "ready." not in Path(log_path).read_text():
            raise RuntimeError(f"celery worker did not start:\n{Path(log_path).read_text()}")

    def kill(self):
        """SIGKILL, as a crashed machine would: no chance to ack or clean up."""
        self.process.kill()
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.fixture(scope="session")
def mlflow_server():
    """A real MLflow tracking server (scripts/mlflow.sh, as the console command starts it) on the test
    settings' port, with its store under the tests' folder, emptied first."""
    from urllib.parse import urlparse

    folder = Path(settings.MLFLOW_DIR)
    with mlflow_process(folder, urlparse(settings.MLFLOW_TRACKING_URI).port):
        yield settings.MLFLOW_TRACKING_URI


@contextmanager
def mlflow_process(folder, port, **environment):
    """scripts/mlflow.sh serving `folder` (emptied first) on `port`, with `environment` added to its own
    (MLFLOW_ARTIFACTS_DESTINATION: a bucket); its URL once it answers, stopped after."""
    import urllib.request

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    url = f"http://127.0.0.1:{port}"
    log = open(folder.parent / f"{folder.name}.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(["bash", "scripts/mlflow.sh", str(folder), str(port)], cwd=settings.BASE_DIR,
                               env={**os.environ, **environment}, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip

    def healthy():
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited:\n{(folder.parent / f'{folder.name}.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, timeout=120, interval=0.5, message="the MLflow server to answer")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


@contextmanager
def agent_process(root):
    """The cluster agent (clusters/agent/server.py) as the backends start it, TLS with the cluster's own CA,
    on the scratch home `root`/home: (the console's client pinned to it, the home, root)."""
    import secrets

    from clusters import tls
    from clusters.agent import server
    from clusters.agent.client import AgentClient, AgentEndpoint

    home, secret, bundle = root / "home", root / "agent.key", root / "tls.pem"
    home.mkdir()
    key = secrets.token_bytes(32)
    secret.write_bytes(key)
    bundle.write_bytes(tls.controller_bundle("agent-test"))
    port_file = root / "port"
    command = [sys.executable, server.__file__, "--home", str(home), "--key-file", str(secret),
               "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--tls-bundle", str(bundle)]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_until(port_file.exists, timeout=20, message="the agent to listen")
        port = int(port_file.read_text())
        ca = tls.ca_of(bundle.read_bytes())
        yield AgentClient(AgentEndpoint(f"https://127.0.0.1:{port}", key.hex(), ca)), home, root
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def celery_worker(redis_broker, tmp_path_factory):
    purge_queue(redis_broker)  # nothing left over from another module's tests
    # With beat, as scripts/console.sh runs it: the periodic Slurm sync keeps the pages current.
    worker = Worker(tmp_path_factory.mktemp("worker") / "worker.log", beat=True, SLURM_SYNC_SECONDS=2)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def slurm():
    """Real Slurm daemons for this module's tests: every fixture that starts Slurm asks for this one, so
    its tests are marked `slurm`; every daemon of the test clusters is stopped when the module ends."""
    yield
    stop_local_clusters()


def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "slurm" in fixtures:
            item.add_marker(pytest.mark.slurm)
        if "redis_broker" in fixtures:
            item.add_marker(pytest.mark.worker)


def slurm_daemons():
    """Pids of the test clusters' munged, slurmctld, slurmd and slurmrestd."""
    root = str(settings.LOCAL_CLUSTERS_DIR)
    names = {"munged", "slurmctld", "slurmd", "slurmrestd"}
    return {
        pid
        for pid, argv in processes.command_lines()
        if os.path.basename(argv[0]) in names and any(root in arg for arg in argv)
    }


@pytest.fixture(autouse=True)
def slurm_only_when_marked(request):
    """A test that starts Slurm must say so (ask for the `slurm` fixture): it fails otherwise, so the fast
    loop never starts a daemon behind the developer's back."""
    if request.node.get_closest_marker("slurm"):
        yield
        return
    before = slurm_daemons()
    yield
    started = slurm_daemons() - before
    if started:
        processes.stop(sorted(started))
        pytest.fail(f"{request.node.nodeid} started Slurm daemons but is not marked slurm: ask for the `slurm` fixture")


@pytest.fixture
def fake(settings, alpha):
    """The fake Google Cloud API (tests/fake_compute.py), provisioning only (its VMs do not boot), with
    the console's gce settings pointing at it and project alpha on Google Cloud project tcc-test."""
    from .fake_compute import FakeGoogleCloud

    cloud = FakeGoogleCloud().start()
    cloud.configure(settings)
    alpha.gcp_project_id = "tcc-test"
    alpha.save()
    yield cloud
    cloud.stop()


def gce_spec(cpu=2):
    """The shipped example on the gce backend, as the booting fake runs it: the console makes the VPC and
    a Filestore /home, and the workers are n2-standard-2 (2 vCPUs: what this machine gives each VM)."""
    spec = example_spec(cpu=cpu)
    spec["node_pools"][1]["machine_spec"]["machine_type"] = "n2-standard-2"
    spec["console"] = {
        "backend": "gce",
        "network": {"create": True, "mtu": 1460, "subnet_range": "10.0.0.0/16",
                    "private_services_range": "10.100.0.0/20"},
        "storage": {"filestore_home": {"tier": "ZONAL", "capacity_gb": 1024}},
    }  # fmt: skip
    return spec


@pytest.fixture(scope="module")
def booted_cloud(tmp_path_factory, slurm):
    """A fake Google Cloud whose instances boot (tests/fake_vms.py: the startup script runs Slurm in
    each VM), for this module. Its settings are in this process's Django settings and in the
    environment, so the Celery workers the module starts reach it too."""
    from django.test import override_settings

    from .fake_compute import FakeGoogleCloud

    cloud = FakeGoogleCloud(boot=True, root=tmp_path_factory.mktemp("cloud")).start()
    values = cloud.settings()
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(value) for name, value in values.items()})
    try:
        with override_settings(**values):
            yield cloud
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cloud.stop()


BACKENDS = ["local", "gce"]  # what a module's shared cluster is parametrised over


@contextmanager
def module_cluster(
    django_db_blocker, *, username, project_slug, cluster_name="train", cpu=2, request=None, backend=None, epilog=()
):
    """A READY cluster shared by a test module, committed outside the tests' transactions: local, or,
    when the module's fixture is parametrised with "gce" (`request.param`), on booted fake VMs; `epilog`
    scripts go into its spec's epilog_bash_scripts."""
    from django.contrib.auth import get_user_model

    from clusters import services

    backend = backend or getattr(request, "param", "local")
    if backend == "gce":
        request.getfixturevalue("booted_cloud")
    with django_db_blocker.unblock():
        owner = get_user_model().objects.create_user(username, f"{username}@example.com", f"{username}-password")
        project = Project.objects.create(slug=project_slug, name=project_slug, gcp_project_id="tcc-test")
        project.members.add(owner, through_defaults={"role": Role.ADMIN})
    try:  # a cluster that fails to come up is stopped too, so the next module starts clean
        with django_db_blocker.unblock():
            spec = gce_spec(cpu=cpu) if backend == "gce" else example_spec(cpu=cpu)
            if epilog:
                spec["orchestrator_spec"]["slurm_spec"]["epilog_bash_scripts"] = list(epilog)
            operation = services.create_cluster(project=project, name=cluster_name, spec=spec, user=owner)
            engine.run(operation.pk)
            cluster = Cluster.objects.get(pk=operation.cluster_id)
            assert cluster.status == ClusterStatus.READY, Operation.objects.get(pk=operation.pk).error or (
                cluster.status_message
            )
        yield cluster
    finally:
        stop_local_clusters()
        with django_db_blocker.unblock():
            project.delete()
            owner.delete()


def stop_local_clusters():
    """Stop every process of the test clusters (jobs, slurmrestd, slurmd, slurmctld, munged) and remove them."""
    root = str(settings.LOCAL_CLUSTERS_DIR)
    doomed = {pid for pid, argv in processes.command_lines() if any(root in arg for arg in argv)}
    doomed |= {
        pid for pid, _ in processes.command_lines() if processes.environ(pid).get("SLURM_CONF", "").startswith(root)
    }
    processes.stop(sorted(doomed))
    shutil.rmtree(root, ignore_errors=True)
    remove_accounts(settings.POSIX_ACCOUNT_PREFIX)  # the users' accounts the tests made


def remove_accounts(prefix):
    """Every account and group whose name starts with `prefix` (the cluster agents made them)."""
    import grp
    import pwd

    for user in pwd.getpwall():
        if user.pw_name.startswith(prefix):
            subprocess.run(["userdel", user.pw_name], capture_output=True, check=False)
    for group in grp.getgrall():
        if group.gr_name.startswith(prefix):
            subprocess.run(["groupdel", group.gr_name], capture_output=True, check=False)


def wait_until(predicate, timeout=60, interval=0.2, message="condition"):
    """The predicate's first true value within `timeout` seconds; `message` (or a callable making it
    when the wait fails, to say what was seen) names what was waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message() if callable(message) else message}")


def synced(cluster, timeout=30):
    """One round of the periodic Slurm sync for `cluster` that started after this call, as Celery beat
    would send it (the task's body, run here, or a worker's if one got there first); pages and GET
    endpoints then show what Slurm said. Returns that sync's error ("" when Slurm answered)."""
    from django.utils import timezone

    from clusters import tasks
    from clusters.models import SlurmSync

    asked = timezone.now()

    def fresh():
        tasks.sync_cluster(cluster.pk)
        row = SlurmSync.objects.filter(pk=cluster.pk).first()
        done = row is not None and row.claimed_until is None and row.attempted and row.attempted >= asked
        return (row.error or "ok") if done else None

    found = wait_until(fresh, timeout=timeout, message=f"a sync of {cluster}")
    return "" if found == "ok" else found


# The suite leaves no process behind. Every process the tests start carries SESSION_MARK in its
# environment (it is in os.environ from the session's start), or names this session's temporary folder
# or this checkout's TEST_ROOT in its command line (Slurm jobs and what they start get their environment
# from the submit, not from us). Whatever of those is still alive once every fixture has been torn down
# fails the run and is then stopped.
SESSION_MARK = f"tcc-tests-{uuid.uuid4().hex[:12]}"
LEFTOVER_GRACE = 10.0  # seconds a process stopped by the last teardown has to exit


def pytest_sessionstart(session):
    os.environ["TCC_TEST_SESSION"] = SESSION_MARK


def started_by_this_session(pid, argv, roots):
    if pid == os.getpid() or pid in ancestors(os.getpid()):
        return False
    if any(root in arg for arg in argv for root in roots):
        return True
    return processes.environ(pid).get("TCC_TEST_SESSION") == SESSION_MARK


def ancestors(pid):
    found = set()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        found.add(pid)
    return found


def leftover_processes(roots):
    return {pid: argv for pid, argv in processes.command_lines() if started_by_this_session(pid, argv, roots)}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's tmp_path_factory
    roots = [str(settings.TEST_ROOT) + "/"]
    if factory is not None and factory._basetemp is not None:
        roots.append(str(factory._basetemp))
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = leftover_processes(roots)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftover_processes(roots)
    if not left:
        return
    lines = "\n".join(f"  {pid}: {' '.join(argv)[:200]}" for pid, argv in sorted(left.items()))
    sys.stderr.write(f"\nThe tests left {len(left)} process(es) running (now stopped):\n{lines}\n")
    processes.stop(sorted(left))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- a browser (Debian's chromium through Playwright), alice signed in ----------------------------------


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make are still
    # plain synchronous calls, which Django would otherwise refuse inside a running loop.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed (apt-get install chromium; .ci/run does)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, alice, alpha):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-password")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    yield page
    context.close()


# -- a replica: recipes/node/serve.py on a tiny model, as a replica's job runs it ---------------------

REPLICA_TOKEN = "replica-token-the-router-alone-holds"


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    """recipes/node/serve.py on a tiny model, as a replica's job runs it (with the token only the router
    holds): its address."""
    from .factories import tiny_model

    folder = tmp_path_factory.mktemp("replica")
    model = tiny_model(folder / "model")
    announce = folder / "announce.json"
    token = folder / "token"
    token.write_text(REPLICA_TOKEN)
    token.chmod(0o600)
    process = subprocess.Popen(
        [sys.executable, "-m", "recipes.node.serve", "--model", str(model), "--served-name", "chat",
         "--version", "tiny:v1", "--announce", str(announce), "--token-file", str(token), "--ports", "18000-18999"],
        stdout=subprocess.DEVNULL, stderr=(folder / "serve.log").open("w"),
    )  # fmt: skip
    wait_until(announce.exists, timeout=60, message="the replica to announce itself")
    port = json.loads(announce.read_text())["port"]
    assert 18000 <= port <= 18999  # in the range it was given
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=20)
