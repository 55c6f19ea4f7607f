"""The router's promises that need no cluster: a real replica process (recipes/node/serve.py on a tiny
model) and a socket that dies mid-request stand behind an in-process router with alice's real token.
A request that reached a replica is never sent again; one that never reached any is retried on
another; an expired token is a 401, another project's a 404 (the live endpoint with the official
SDK: test_endpoints.py)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from aiohttp.test_utils import TestClient, TestServer
from django.utils import timezone

from console.models import APIToken
from recipes.serving import router as routing

from .conftest import REPLICA_TOKEN, wait_until
from .factories import call, connected_in_a_burst, free_port

pytestmark = pytest.mark.django_db(transaction=True)


class Dying(threading.Thread):
    """A 'replica' that reads each request and closes the connection without answering."""

    def __init__(self):
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port, self.requests = self.server.getsockname()[1], 0

    def run(self):
        while True:
            connection, _ = self.server.accept()
            connection.recv(65536)
            self.requests += 1
            connection.close()


async def start_with(router, app, alpha, replicas):
    """The router's pool as start() makes it, none of its loops (the test reads no table from the
    database and probes by hand), and a table of one endpoint "chat" of alpha with `replicas`."""
    await routing.Router.start(router, app)
    for task in app[routing.TASKS]:
        task.cancel()
    router.routes = {("alpha", "chat"): routing.Route(1, alpha.pk, replicas, "tiny:v1", "chat", ("chat",))}


def through(alpha, replicas, requests):
    """Run `requests` (async callables of a TestClient) against a router whose table holds `replicas`."""

    async def main():
        app = routing.application()
        app.on_startup.clear()
        app.on_startup.append(lambda _app: start_with(_app[routing.ROUTER], _app, alpha, replicas))
        async with TestClient(TestServer(app)) as client:
            return [await request(client) for request in requests]

    return asyncio.run(main())


def completion(token, body=None):
    async def send(client):
        answer = await client.post("/alpha/chat/v1/completions", json=body or {"model": "chat", "prompt": "hi",
                                   "max_tokens": 3}, headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        return answer.status, await answer.json()

    return send


def test_a_request_a_replica_may_have_started_is_never_sent_to_another(alpha, alice, replica):
    _, token = APIToken.issue(alice, "router")
    dying = Dying()
    dying.start()
    replicas = [(1, f"http://127.0.0.1:{dying.port}", "tiny:v1", ""), (2, replica, "tiny:v1", REPLICA_TOKEN)]
    [(status, body)] = through(alpha, replicas, [completion(token)])
    assert (status, body["error"]["message"]) == (502, "the replica closed the connection")
    assert dying.requests == 1  # and the healthy replica never saw it (a retry would have answered 200)


def test_a_request_no_replica_received_is_retried_on_another(alpha, alice, replica):
    _, token = APIToken.issue(alice, "router")
    refused = (1, f"http://127.0.0.1:{free_port()}", "tiny:v1", "")
    answers = through(alpha, [refused, (2, replica, "tiny:v1", REPLICA_TOKEN)], [completion(token), completion(token)])
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1]["model"] == "chat" and answers[0][1]["system_fingerprint"] == "tiny:v1"


def test_tokens_and_models_are_refused_in_openais_shape(alpha, alice, charlie, charlies_project, replica):
    _, token = APIToken.issue(alice, "router")
    _, expired = APIToken.issue(alice, "old", expires=timezone.now() - timedelta(minutes=1))
    _, charlies = APIToken.issue(charlie, "charlie")
    answers = through(alpha, [(2, replica, "tiny:v1", REPLICA_TOKEN)], [
        completion(expired), completion("tcc_made_up"), completion(charlies),
        completion(token, {"model": "gpt-4", "prompt": "hi"}), completion(token, {"prompt": "hi", "max_tokens": 2}),
    ])  # fmt: skip
    assert [status for status, _ in answers] == [401, 401, 404, 404, 200]
    assert answers[0][1]["error"]["code"] == "invalid_api_key"
    assert answers[3][1]["error"] | {"message": ""} == {
        "message": "", "type": "invalid_request_error", "param": "model", "code": "model_not_found",
        "status": "NOT_FOUND",
    }  # fmt: skip


class Slow(threading.Thread):
    """A 'replica' that answers every request after `seconds`, one connection per thread."""

    def __init__(self, seconds):
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port, self.seconds, self.most, self.now = self.server.getsockname()[1], seconds, 0, 0
        self.lock, self.requests = threading.Lock(), 0

    def run(self):
        while True:
            connection, _ = self.server.accept()
            threading.Thread(target=self.answer, args=(connection,), daemon=True).start()

    def answer(self, connection):
        with self.lock:
            self.now += 1
            self.requests += 1
            self.most = max(self.most, self.now)
        connection.recv(65536)
        time.sleep(self.seconds)
        body = b'{"object": "text_completion", "model": "chat", "choices": []}'
        with self.lock:  # the request ends as its answer leaves: the router may send the next one at once
            self.now -= 1
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)  # fmt: skip
        connection.close()


def test_past_its_replicas_room_and_queue_a_request_gets_429_with_retry_after_at_once(alpha, alice, settings):
    settings.ROUTER_REPLICA_CONCURRENCY, settings.ROUTER_QUEUE_PER_REPLICA, settings.ROUTER_QUEUE_SECONDS = 2, 2, 30
    _, token = APIToken.issue(alice, "router")
    slow = Slow(1.0)
    slow.start()

    async def burst(client):
        async def one():
            started = time.monotonic()
            answer = await client.post("/alpha/chat/v1/completions", json={"model": "chat", "prompt": "hi"},
                                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            return answer.status, answer.headers.get("Retry-After"), await answer.json(), time.monotonic() - started

        answers = await asyncio.gather(*(one() for _ in range(7)))
        return answers, dict(client.server.app[routing.ROUTER].peak)

    [(answers, peak)] = through(alpha, [(1, f"http://127.0.0.1:{slow.port}", "tiny:v1", "")], [burst])
    assert peak == {1: 2}  # the sample's queue depth, which the autoscaler reacts to at once
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert (len(served), len(refused)) == (4, 3)  # 2 at once on the replica, 2 queued; the rest refused
    assert slow.most == 2  # the replica never had more than its limit
    assert all(retry == "3" and seconds < 0.5 for _, retry, _, seconds in refused)  # at once, with a delay
    assert refused[0][2]["error"]["code"] == "rate_limit_exceeded"
    assert max(seconds for *_, seconds in served) >= 2.0  # the queued two waited for a free slot


def test_a_queued_request_goes_to_a_replica_of_the_latest_table_never_one_drained_meanwhile(alpha, alice, settings):
    """A roll drains the old replica while a request waits in the queue for it: the request goes to the
    new replica as soon as the routers' table has it. It went to the old one once that was free (the
    table of its arrival), after the drain began: a drain could cut it."""
    settings.ROUTER_REPLICA_CONCURRENCY = 1
    _, token = APIToken.issue(alice, "router")
    old, new = Slow(1.5), Slow(0.1)
    old.start()
    new.start()

    async def roll_while_one_waits(client):
        router = client.server.app[routing.ROUTER]

        async def send():
            started = time.monotonic()
            answer = await client.post("/alpha/chat/v1/completions", json={"model": "chat", "prompt": "hi"},
                                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            return answer.status, time.monotonic() - started

        first = asyncio.create_task(send())
        await asyncio.sleep(0.3)
        second = asyncio.create_task(send())
        await asyncio.sleep(0.3)
        queued = dict(router.waiting)
        rolled = [(2, f"http://127.0.0.1:{new.port}", "tiny:v2", "")]
        router.routes = {("alpha", "chat"): routing.Route(1, alpha.pk, rolled, "tiny:v2", "chat", ("chat",))}
        await router.wake_waiting()  # what each refresh of the table does
        return queued, await first, await second

    [(queued, first, second)] = through(alpha, [(1, f"http://127.0.0.1:{old.port}", "tiny:v1", "")],
                                        [roll_while_one_waits])  # fmt: skip
    assert queued == {1: 1}  # the second request waited behind the first
    assert first[0] == second[0] == 200
    assert (old.requests, new.requests) == (1, 1)
    assert second[1] < 1.2  # taken by the new replica at once, not after the old one was free (1.5 s)


def test_a_replica_failing_health_is_ejected_and_routed_again_once_it_passes(alpha, settings, replica):
    settings.ROUTER_HEALTH_EJECT_AFTER = 2
    port = free_port()
    quiet = (1, f"http://127.0.0.1:{port}", "tiny:v1", "")

    async def main():
        router = routing.Router()
        await start_with(router, {}, alpha, [quiet, (2, replica, "tiny:v1", REPLICA_TOKEN)])
        seen = []
        await router.check_health()
        seen.append((set(router.ejected), router.pick(router.routes[("alpha", "chat")], set())[0]))
        await router.check_health()  # the second failure in a row
        seen.append((set(router.ejected), router.pick(router.routes[("alpha", "chat")], {2})))
        # Something answers /health on the quiet replica's port again: one passing probe routes it.
        server = await asyncio.start_server(health_ok, "127.0.0.1", port)
        await router.check_health()
        seen.append((set(router.ejected), router.pick(router.routes[("alpha", "chat")], {2})[0]))
        server.close()
        await router.session.close()
        return seen

    first, second, third = asyncio.run(main())
    assert first == (set(), 1)  # one failure is not enough (the least loaded, first replica, is picked)
    assert second == ({1}, None)  # ejected: with the healthy one tried, nothing is left to pick
    assert third == (set(), 1)


async def health_ok(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()


def test_prometheus_scrapes_the_routers_figures_with_its_token_only(alpha, alice, replica, settings, tmp_path):
    _, token = APIToken.issue(alice, "router")
    secret = tmp_path / "metrics-token"
    secret.write_text("scrape-me\n")
    settings.METRICS_TOKEN_FILE = str(secret)

    def scrape(header):
        async def get(client):
            answer = await client.get("/metrics", headers={"Authorization": header} if header else {})
            return answer.status, await answer.text()

        return get

    body = {"model": "chat", "prompt": "hi", "max_tokens": 3}
    answers = through(alpha, [(2, replica, "tiny:v1", REPLICA_TOKEN)], [
        completion(token, body), completion(token, {**body, "model": "nope"}), scrape("Bearer scrape-me"),
        scrape("Bearer guess"), scrape(None),
    ])  # fmt: skip
    assert [status for status, _ in answers] == [200, 404, 200, 401, 401]
    text = answers[2][1]
    assert 'tcc_router_requests_total{code="200",endpoint="chat",project="alpha"} 1.0' in text
    assert 'tcc_router_requests_total{code="404",endpoint="chat",project="alpha"} 1.0' in text
    assert 'tcc_router_tokens_total{endpoint="chat",kind="completion",project="alpha"}' in text
    assert 'tcc_router_request_seconds_bucket{endpoint="chat",le="120.0",project="alpha"} 2.0' in text
    settings.METRICS_TOKEN_FILE = ""
    assert through(alpha, [], [scrape("Bearer scrape-me")])[0][0] == 404  # off unless a token is set


def test_a_replica_answers_its_router_alone(alpha, alice, replica):
    """The attack: another member's job on the node (or anyone who reaches it) finds the replica's port and
    sends it requests directly, past the router's token check, project rule and limits. It answered 200
    before; now only the router's per-replica token is admitted (/health stays open for probes)."""
    prompt = {"prompt": "hi", "max_tokens": 2}
    for token in (None, "a-guess", REPLICA_TOKEN + "x"):
        for path, body in (("/v1/completions", prompt), ("/v1/models", None), ("/predict", {"instances": ["hi"]})):
            status, answer = call(replica, path, body, token)
            assert (status, answer["error"]["code"]) == (401, "invalid_api_key"), (path, token)
    assert call(replica, "/health")[0] == 200
    _, console_token = APIToken.issue(alice, "router")
    [(status, body)] = through(alpha, [(2, replica, "tiny:v1", REPLICA_TOKEN)], [completion(console_token)])
    assert status == 200 and body["choices"][0]["text"] is not None


def test_a_burst_of_new_clients_waits_for_the_router_none_is_dropped(settings):
    """Hundreds of clients connecting at once while the router's loop is busy: aiohttp's default backlog of
    128 had the kernel drop the SYNs beyond it, and each of those clients waited 1 s (or 3, 7 ...) more."""
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "CONSOLE_WORKER_USES_TEST_DB": "1"}
    router = subprocess.Popen([sys.executable, "manage.py", "router", "--port", str(port)], cwd=settings.BASE_DIR,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def listening():
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, timeout=60, message="the router to listen")
        router.send_signal(signal.SIGSTOP)  # busy: it accepts nothing for a moment
        try:
            assert connected_in_a_burst(("127.0.0.1", port), count=300, wait=0.2) == 300
        finally:
            router.send_signal(signal.SIGCONT)
    finally:
        router.terminate()
        router.wait(timeout=20)
