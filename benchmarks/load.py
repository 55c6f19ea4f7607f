"""The console's web tier under many API clients at once: gunicorn (as scripts/console.sh serves it) on
the benchmark's database, and CLIENTS concurrent clients for SECONDS seconds, each signed in with its
own token, sending the mix an automation fleet sends: list clusters, get a cluster, list its nodes
(90%), and create a cluster then delete it (10%; the create answers 202 with its operation, the delete
a 409 while that operation waits: no worker runs, so no Slurm starts and only the web tier and the
database are measured). Prints p50/p95/p99 per request kind, requests/s and every non-2xx status.

Goal (issue #24): 0 server errors, reads p95 under 300 ms, with 200 clients on PostgreSQL:
    bash scripts/postgres.sh
    BENCH_DATABASE_URL="postgres://postgres@/bench?host=/tmp/tcc-postgres&port=55432" \
        .venv/bin/python benchmarks/load.py [CLIENTS=200] [SECONDS=30] [WEB_WORKERS=4]
(the database `bench` must exist and be empty: createdb/dropdb as the postgres account). The
throttles are raised for the run: one user per client would otherwise be cut at 600 reads a minute.
"""

import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from _setup import ROOT, WORK, bench_project, scratch_django

CLIENTS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 30
WEB_WORKERS = int(sys.argv[3]) if len(sys.argv) > 3 else 4
CLUSTERS = 50

ENV = scratch_django(
    API_READS_PER_MINUTE="1000000", API_WRITES_PER_MINUTE="1000000", OPERATION_CHECK_BROKER="false",
    DB_CONN_MAX_AGE="60",
)  # fmt: skip

from django.contrib.auth import get_user_model  # noqa: E402

from clusters.choices import Role  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.services import create_cluster  # noqa: E402
from console.models import APIToken  # noqa: E402
from tests.conftest import example_spec, provisioned  # noqa: E402


def seed():
    """CLUSTERS ready clusters of 3 nodes in project "bench" and one token per client."""
    owner, project = bench_project()
    for n in range(CLUSTERS):
        create_cluster(project=project, name=f"c{n:03}", spec=example_spec(), user=owner)
    provisioned(project=project)
    tokens = []
    for n in range(CLIENTS):
        user = get_user_model().objects.create_user(f"client{n}")
        project.members.add(user, through_defaults={"role": Role.ADMIN})
        tokens.append(APIToken.issue(user, "load")[1])
    return tokens


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(port):
    log = open(WORK / "gunicorn.log", "w")  # noqa: SIM115 - the process outlives this function
    process = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "console.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", str(WEB_WORKERS), "--timeout", "60", "--no-control-socket", "--backlog", "2048"],
        cwd=ROOT, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"gunicorn did not start:\n{(WORK / 'gunicorn.log').read_text()[-2000:]}")


async def client(session, base, token, number, until, timings, statuses):
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"}
    api = f"{base}/api/v1/projects/bench/clusters/"
    spec = example_spec()
    made = 0
    rng = random.Random(number)
    while time.monotonic() < until:
        roll = rng.random()
        name = f"c{rng.randrange(CLUSTERS):03}"
        if roll < 0.3:
            requests = [("list clusters", "GET", api, None)]
        elif roll < 0.6:
            requests = [("get cluster", "GET", f"{api}{name}/", None)]
        elif roll < 0.9:
            requests = [("list nodes", "GET", f"{api}{name}/nodes/", None)]
        else:
            made += 1
            mine = f"l{number:03}-{made}"
            requests = [("create", "POST", api, {"cluster_id": mine, "spec": spec}),
                        ("delete", "DELETE", f"{api}{mine}/", None)]  # fmt: skip
        for kind, method, url, body in requests:
            started = time.perf_counter()
            try:
                async with session.request(method, url, json=body, headers=headers) as answer:
                    await answer.read()
                    statuses[kind][answer.status] += 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                statuses[kind][type(exc).__name__] += 1
                continue
            timings[kind].append(time.perf_counter() - started)


async def load(base, tokens):
    import aiohttp

    timings, statuses = defaultdict(list), defaultdict(lambda: defaultdict(int))
    connector = aiohttp.TCPConnector(limit=0)  # one connection per client at most, no pool cap
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        until = time.monotonic() + SECONDS
        await asyncio.gather(
            *(client(session, base, token, n, until, timings, statuses) for n, token in enumerate(tokens))
        )
    return timings, statuses


def main():
    tokens = seed()
    port = free_port()
    server = serve(port)
    try:
        started = time.monotonic()
        timings, statuses = asyncio.run(load(f"http://127.0.0.1:{port}", tokens))
        elapsed = time.monotonic() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    engine = os.environ.get("BENCH_DATABASE_URL", "sqlite").split(":", 1)[0]
    total = sum(len(v) for v in timings.values())
    print(f"{CLIENTS} clients, {SECONDS:.0f} s, gunicorn x {WEB_WORKERS} workers, {engine}, {CLUSTERS} clusters")
    print(f"{total} requests, {total / elapsed:.0f}/s")
    print("request        |     n |  p50 ms |  p95 ms |  p99 ms | statuses")
    for kind in ("list clusters", "get cluster", "list nodes", "create", "delete"):
        values = sorted(timings.get(kind, []))
        if not values:
            continue
        q = statistics.quantiles(values, n=100) if len(values) > 1 else [values[0]] * 99
        shown = ", ".join(f"{status}: {count}" for status, count in sorted(statuses[kind].items(), key=str))
        print(f"{kind:<14} | {len(values):>5} | {q[49] * 1000:>7.1f} | {q[94] * 1000:>7.1f} | "
              f"{q[98] * 1000:>7.1f} | {shown}")  # fmt: skip
    errors = sum(c for s in statuses.values() for status, c in s.items() if not str(status).startswith(("2", "4")))
    print(f"server errors and failed connections: {errors}")
    print(f"clusters made by the clients: {Cluster.objects.filter(name__startswith='l').count()}")
    Path(WORK / "gunicorn.log").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
