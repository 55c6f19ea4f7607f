"""Serving under concurrent clients, without Slurm: real replica processes (recipes/node/serve.py on a
tiny Llama, each pinned to its own core with taskset) behind the router (in this process, on a
port of its own), with a real console token. For 1, 50 and 200 concurrent clients (and 500 with
ROUTER_REPLICA_CONCURRENCY x queue set low enough to shed load), streaming and not: requests/s,
p50/p95 latency, p95 time to the first chunk (streams), and answers by HTTP status. Then the
router's overhead: p50 through it over p50 straight to a replica, one client.

Usage: .venv/bin/python benchmarks/serving.py [seconds per measure (10)]
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

from _setup import ROOT, WORK, bench_project, scratch_django

scratch_django(ROUTER_REPLICA_CONCURRENCY="8", ROUTER_QUEUE_PER_REPLICA="32", ROUTER_QUEUE_SECONDS="30")

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from console.models import APIToken  # noqa: E402
from recipes.serving import router as routing  # noqa: E402

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
BODY = {"model": "chat", "prompt": "hello", "max_tokens": 8}


def tiny_model(folder):
    sys.path.insert(0, str(ROOT))
    from tests.factories import tiny_model as make

    return make(folder)


def start_replica(model, core):
    announce = WORK / f"announce-{core}.json"
    command = ["taskset", "-c", str(core), sys.executable, "-m", "recipes.node.serve", "--model", str(model),
               "--served-name", "chat", "--version", "tiny:v1", "--announce", str(announce)]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not announce.exists():
        time.sleep(0.2)
    return process, f"http://127.0.0.1:{json.loads(announce.read_text())['port']}"


async def measure(base, headers, clients, stream, seconds):
    latencies, firsts, statuses = [], [], Counter()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def client():
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    async with session.post(base + "/v1/completions", json={**BODY, "stream": stream},
                                            headers=headers) as answer:  # fmt: skip
                        first = None
                        async for _ in answer.content.iter_any():
                            first = first or time.monotonic() - started
                        statuses[answer.status] += 1
                        if answer.status == 200:
                            latencies.append(time.monotonic() - started)
                            if stream and first is not None:
                                firsts.append(first)
                except (aiohttp.ClientError, TimeoutError):
                    statuses["error"] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    q = lambda values, f: round(sorted(values)[int(f * (len(values) - 1))] * 1000) if values else None  # noqa: E731
    return {"clients": clients, "stream": stream, "requests_per_s": round(len(latencies) / seconds, 1),
            "p50_ms": q(latencies, 0.5), "p95_ms": q(latencies, 0.95), "p95_first_chunk_ms": q(firsts, 0.95),
            "answers": dict(statuses)}  # fmt: skip


def serve_router(project, replicas):
    """The router in a thread of its own, with the benchmark's table; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = threading.Event()

    def run():
        async def main():
            app = routing.application()
            app.on_startup.clear()
            router = app[routing.ROUTER]

            async def startup(_app):
                await routing.Router.start(router, _app)
                # No table from the database (this one), no samples: no endpoint row.
                for task in _app[routing.TASKS][:2]:
                    task.cancel()
                router.routes = {("bench", "chat"): routing.Route(1, project.pk, replicas, "tiny:v1", "chat",
                                                                  ("chat",))}  # fmt: skip

            app.on_startup.append(startup)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, backlog=routing.BACKLOG).start()
            ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
    ready.wait()
    return f"http://127.0.0.1:{port}/bench/chat"


def main():
    user, project = bench_project()
    _, token = APIToken.issue(user, "bench")
    headers = {"Authorization": f"Bearer {token}"}
    model = tiny_model(WORK / "model")
    cores = os.cpu_count() or 1
    started = [start_replica(model, core % cores) for core in range(2)]
    try:
        direct = asyncio.run(measure(started[0][1], {}, 1, False, SECONDS))
        one = serve_router(project, [(1, started[0][1], "tiny:v1", "")])
        through = asyncio.run(measure(one, headers, 1, False, SECONDS))
        print(f"router overhead, 1 client: p50 {through['p50_ms']} ms through it / {direct['p50_ms']} ms direct = "
              f"{through['p50_ms'] / direct['p50_ms']:.2f}x")  # fmt: skip
        two = serve_router(project, [(1, started[0][1], "tiny:v1", ""), (2, started[1][1], "tiny:v1", "")])
        single = asyncio.run(measure(one, headers, 50, False, SECONDS))
        double = asyncio.run(measure(two, headers, 50, False, SECONDS))
        print(f"50 clients: 1 replica {single['requests_per_s']} req/s, 2 replicas {double['requests_per_s']} req/s "
              f"({double['requests_per_s'] / single['requests_per_s']:.2f}x)")  # fmt: skip
        for clients in (1, 50, 200, 500):
            for stream in (False, True):
                print(json.dumps(asyncio.run(measure(two, headers, clients, stream, SECONDS))))
    finally:
        for process, _ in started:
            process.terminate()


if __name__ == "__main__":
    main()
