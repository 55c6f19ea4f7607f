"""The inference router: an asyncio HTTP proxy in front of every endpoint's replicas, outside Django's
request cycle (`python manage.py router`; ROUTER_HOST:ROUTER_PORT, 127.0.0.1:8100 by default).

Why not HAProxy: every request must pass the console's token check and project rule (an outsider
gets 404, as on every other surface), the routing table changes with every roll and scale (replicas
are Slurm jobs on ephemeral ports), and the autoscaler needs per-endpoint in-flight counts and
latencies. One small asyncio process does all three with the console's own models; it keeps no
state that matters (a restart loses one sample interval), and several can run behind a load
balancer (each writes its own samples; the autoscaler sums them per interval).

    GET  /<project>/<endpoint>/v1/models
    POST /<project>/<endpoint>/v1/completions | /v1/chat/completions   (OpenAI's protocol)
    POST /<project>/<endpoint>:predict   {"instances": [...]} -> {"predictions": [...], "deployedModelId"}

`Authorization: Bearer <console API token>`. Requests go to the routed (READY) replica with the fewest
in flight (least connections); one that refuses a connection is skipped for a few seconds and the
request is retried on another, so a replica that stops between refreshes costs no failed request.
Every ROUTER_SAMPLE_SECONDS each endpoint's requests, errors (5xx and unreachable replicas),
p50/p95 latency, mean requests in flight (Little's law over the interval) and routed replicas are
written as an EndpointSample; the endpoint page charts them and the autoscaler reads them.
"""

import asyncio
import collections
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

from aiohttp import ClientConnectionError, ClientSession, ClientTimeout, web
from django.conf import settings
from django.utils import timezone

from clusters import access

from ..models import Endpoint, EndpointSample, EndpointStatus, ReplicaState

log = logging.getLogger("recipes.router")


@dataclass
class Route:
    endpoint_id: int
    project_id: int
    replicas: list  # [(replica id, url, version "name:vN")]
    version: str = ""


@dataclass
class Stats:
    requests: int = 0
    errors: int = 0
    busy: float = 0.0  # request-seconds in the interval
    latencies: list = field(default_factory=list)


def percentile(values, fraction):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class TokenCache:
    """What the console said of a token (user id and project ids, or None for a bad one), for `ttl`
    seconds, for at most `size` tokens: a client sending a stream of made-up tokens costs one lookup
    each and pushes out the oldest entries, never the router's memory. Keyed by the token's SHA-256."""

    def __init__(self, size, ttl):
        self.size, self.ttl, self.entries = size, ttl, collections.OrderedDict()

    @staticmethod
    def key(raw):
        return hashlib.sha256(raw.encode(errors="replace")).digest()

    def get(self, raw):
        """(True, what was said) while an entry is fresh, else (False, None)."""
        entry = self.entries.get(self.key(raw))
        if entry is None or entry[0] < time.monotonic():
            return False, None
        return True, entry[1]

    def put(self, raw, found):
        key = self.key(raw)
        self.entries.pop(key, None)
        self.entries[key] = (time.monotonic() + self.ttl, found)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def __len__(self):
        return len(self.entries)


class Router:
    def __init__(self):
        self.routes = {}  # (project slug, endpoint name) -> Route
        self.in_flight = {}  # replica id -> requests in flight
        self.suspect = {}  # replica id -> monotonic time until which it is skipped
        self.stats = {}  # endpoint id -> Stats
        self.tokens = TokenCache(settings.ROUTER_TOKEN_CACHE_SIZE, settings.ROUTER_TOKEN_CACHE_SECONDS)
        self.session = None
        self.interval_started = time.monotonic()

    # -- the console's database, in a thread --------------------------------------------------

    def load_routes(self):
        routes = {}
        endpoints = Endpoint.objects.filter(status__in=EndpointStatus.live()).select_related("project", "serving")
        replicas = {}
        for endpoint_id, replica_id, host, port, version in (
            Endpoint.objects.filter(status__in=EndpointStatus.live(), replicas__state=ReplicaState.READY)
            .values_list("pk", "replicas__pk", "replicas__host", "replicas__port", "replicas__version_ref")
        ):  # fmt: skip
            replicas.setdefault(endpoint_id, []).append((replica_id, f"http://{host}:{port}", version))
        for endpoint in endpoints:
            routes[(endpoint.project.slug, endpoint.name)] = Route(
                endpoint.pk, endpoint.project_id, replicas.get(endpoint.pk, []),
                endpoint.serving.ref if endpoint.serving else "",
            )  # fmt: skip
        return routes

    def check_token(self, raw):
        """(user id, {project ids the token reaches}) or None (clusters.access, as for every page)."""
        return access.token_projects(raw)

    def write_samples(self, stats, seconds, routed):
        now = timezone.now()
        rows = [
            EndpointSample(
                endpoint_id=endpoint_id,
                time=now,
                seconds=seconds,
                requests=s.requests,
                errors=s.errors,
                p50_ms=percentile(s.latencies, 0.5),
                p95_ms=percentile(s.latencies, 0.95),
                in_flight=s.busy / seconds if seconds else 0.0,
                replicas=routed.get(endpoint_id, 0),
            )
            for endpoint_id, s in stats.items()
        ]
        EndpointSample.objects.bulk_create(rows)

    # -- loops ----------------------------------------------------------------------------------

    async def refresh_forever(self):
        while True:
            try:
                self.routes = await asyncio.to_thread(self.load_routes)
            except Exception:  # a database hiccup: keep the last table
                log.exception("could not read the routing table")
            await asyncio.sleep(settings.ROUTER_REFRESH_SECONDS)

    async def sample_forever(self):
        while True:
            await asyncio.sleep(settings.ROUTER_SAMPLE_SECONDS)
            now = time.monotonic()
            seconds, self.interval_started = now - self.interval_started, now
            stats, self.stats = self.stats, {}
            for route in self.routes.values():  # an endpoint with no traffic still has a sample (idle)
                stats.setdefault(route.endpoint_id, Stats())
            routed = {route.endpoint_id: len(route.replicas) for route in self.routes.values()}
            try:
                await asyncio.to_thread(self.write_samples, stats, seconds, routed)
            except Exception:
                log.exception("could not write the samples")

    # -- requests -------------------------------------------------------------------------------

    async def authorised(self, request, route):
        header = request.headers.get("Authorization", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not raw:
            return None
        hit, found = self.tokens.get(raw)
        if not hit:
            found = await asyncio.to_thread(self.check_token, raw)
            self.tokens.put(raw, found)
        return found is not None and route.project_id in found[1]

    def pick(self, route, tried):
        now = time.monotonic()
        choices = [r for r in route.replicas if r[0] not in tried and self.suspect.get(r[0], 0) < now]
        if not choices:
            choices = [r for r in route.replicas if r[0] not in tried]
        if not choices:
            return None
        return min(choices, key=lambda choice: self.in_flight.get(choice[0], 0))

    async def forward(self, route, method, path, body):
        """(status, JSON body, version) from a replica, retried on another one that accepts."""
        tried = set()
        for _ in range(max(1, min(3, len(route.replicas)))):
            chosen = self.pick(route, tried)
            if chosen is None:
                break
            replica_id, url, version = chosen
            tried.add(replica_id)
            self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
            try:
                async with self.session.request(method, url + path, data=body,
                                                headers={"Content-Type": "application/json"}) as answer:  # fmt: skip
                    payload = await answer.read()
                    # vLLM's answers do not name the version; the table does.
                    return answer.status, payload, answer.headers.get("X-Model-Version") or version
            except (TimeoutError, ClientConnectionError):
                self.suspect[replica_id] = time.monotonic() + 5
                continue
            finally:
                self.in_flight[replica_id] -= 1
        return failure("no replica of this endpoint is serving yet", 503)

    async def handle(self, request):
        started = time.monotonic()
        project, name, rest = request.match_info["project"], request.match_info["endpoint"], request.match_info["rest"]
        route = self.routes.get((project, name))
        if route is None or not await self.authorised(request, route):
            return json_response(404, error_body("no such endpoint", 404))
        stats = self.stats.setdefault(route.endpoint_id, Stats())
        status = 500
        try:
            if rest == ":predict" and request.method == "POST":
                status, body, version = await self.predict(route, await request.read())
            elif rest in ("/v1/completions", "/v1/chat/completions") and request.method == "POST":
                status, body, version = await self.forward(route, "POST", rest, await request.read())
            elif rest == "/v1/models" and request.method == "GET":
                status, body, version = await self.forward(route, "GET", rest, None)
            else:
                status, body, version = failure("no such path", 404)
            response = web.Response(status=status, body=body, content_type="application/json")
            if version:
                response.headers["X-Model-Version"] = version
            return response
        finally:
            elapsed = time.monotonic() - started
            stats.requests += 1
            stats.busy += elapsed
            stats.latencies.append(elapsed * 1000)
            if status >= 500:
                stats.errors += 1

    async def predict(self, route, raw):
        """The managed service's :predict on the replicas' /v1/completions: each instance one completion."""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return failure('the body must be JSON: {"instances": [...]}', 400)
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not 1 <= len(instances) <= 32:
            return failure("instances must be a list of 1 to 32 prompts", 400)
        predictions, version = [], ""
        for instance in instances:
            if isinstance(instance, str):
                instance = {"prompt": instance}
            if not isinstance(instance, dict) or not isinstance(instance.get("prompt"), str):
                return failure('each instance is a prompt or {"prompt": ...}', 400)
            request = {"prompt": instance["prompt"], "max_tokens": instance.get("max_tokens", 16)}
            status, answer, version = await self.forward(route, "POST", "/v1/completions", json.dumps(request))
            if status != 200:
                try:
                    message = json.loads(answer)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = "the replica refused the instance"
                status, body, _ = failure(message, status)
                return status, body, version
            predictions.append(json.loads(answer)["choices"][0]["text"])
        return 200, json.dumps({"predictions": predictions, "deployedModelId": version}).encode(), version

    async def start(self, app):
        self.session = ClientSession(timeout=ClientTimeout(total=settings.ROUTER_REQUEST_TIMEOUT, connect=3))
        self.routes = await asyncio.to_thread(self.load_routes)
        app["tasks"] = [asyncio.create_task(self.refresh_forever()), asyncio.create_task(self.sample_forever())]

    async def stop(self, app):
        for task in app["tasks"]:
            task.cancel()
        await self.session.close()


STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE"}


def error_body(message, code):
    """OpenAI's error shape, with google.rpc's code and status beside it (the :predict callers' shape)."""
    return {"error": {"message": message, "type": "invalid_request_error" if code == 400 else "api_error",
                      "code": code, "status": STATUS.get(code, "INTERNAL")}}  # fmt: skip


def failure(message, code):
    """(status, body, version) of a refusal the router answers itself."""
    return code, json.dumps(error_body(message, code)).encode(), ""


def json_response(status, body):
    return web.json_response(body, status=status)


def application():
    router = Router()
    app = web.Application(client_max_size=1 << 20)
    app.router.add_route("*", r"/{project:[a-z0-9-]+}/{endpoint:[a-z0-9-]+}{rest:(:predict|/.*)}", router.handle)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    app["router"] = router
    return app


def serve(host, port):
    web.run_app(application(), host=host, port=port, access_log=None, print=lambda *_: None)
