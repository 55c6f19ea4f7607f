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

`Authorization: Bearer <console API token>`: a missing, invalid or expired token is a 401 (OpenAI's
invalid_api_key, which the SDK raises as AuthenticationError); a valid token of another project gets
404, as on every other surface. A request's `model` must be one of the endpoint's names (its own name,
the model version it serves as name:vN, or name@alias when it follows an alias; /v1/models lists
them), else 404 model_not_found; it is rewritten to the name the replica serves. `stream: true` is
passed through as server-sent events, unbuffered; every replica's /health is probed every
ROUTER_HEALTH_SECONDS, and one that fails ROUTER_HEALTH_EJECT_AFTER probes in a row is routed no
request until a probe passes again; a client that goes away closes the replica's stream,
which stops the generation. Requests go to the routed (READY) replica with the fewest in flight (least
connections), at most ROUTER_REPLICA_CONCURRENCY each; when every replica is full a request waits in
the endpoint's bounded queue (ROUTER_QUEUE_PER_REPLICA per replica, up to ROUTER_QUEUE_SECONDS), and
when the queue is full too it is answered 429 with Retry-After at once, in OpenAI's shape (the SDK's
RateLimitError, which it retries after that delay). Only a request that never reached a replica (its
connection was refused or could not be made) is retried on another, and that replica is skipped for a
few seconds; one that may have started (reset or timed out after sending) is answered 502 or 504,
never sent twice.
Every ROUTER_SAMPLE_SECONDS each endpoint's requests, errors (5xx and unreachable replicas),
p50/p95 latency, mean requests in flight (Little's law over the interval), the most requests queued
at once and routed replicas are written as an EndpointSample; the endpoint page charts them and the
autoscaler reads them (a queue scales up at once).
"""

import asyncio
import collections
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, replace

from aiohttp import ClientConnectionError, ClientConnectorError, ClientSession, ClientTimeout, TCPConnector, web
from django.conf import settings
from django.utils import timezone

from clusters import access
from console.auth import scrape_allowed

from ..models import Endpoint, EndpointSample, EndpointStatus, ReplicaState

log = logging.getLogger("recipes.router")


@dataclass
class Route:
    endpoint_id: int
    project_id: int
    replicas: list  # [(replica id, url, version "name:vN", the replica's bearer token or "")]
    version: str = ""
    name: str = ""  # what the replicas serve (the endpoint's name): every request's model is rewritten to it
    names: tuple = ()  # the models a client may ask for


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


class Metrics:
    """The router's figures in Prometheus' text format (GET /metrics with METRICS_TOKEN_FILE's token):
    requests by endpoint and HTTP code, latency and time-to-first-token histograms, prompt and
    completion tokens (from the answers' usage), requests in flight per replica and queued per endpoint."""

    SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

    def __init__(self, router):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.router, self.registry = router, CollectorRegistry()
        labels = ["project", "endpoint"]
        self.requests = Counter("tcc_router_requests", "Requests answered, by HTTP code", [*labels, "code"],
                                registry=self.registry)  # fmt: skip
        self.latency = Histogram("tcc_router_request_seconds", "Time to the whole answer (streams: to their end)",
                                 labels, buckets=self.SECONDS, registry=self.registry)  # fmt: skip
        self.first_token = Histogram("tcc_router_time_to_first_token_seconds", "Streams: time to the first chunk",
                                     labels, buckets=self.SECONDS, registry=self.registry)  # fmt: skip
        self.tokens = Counter("tcc_router_tokens", "Tokens in prompts and completions (answers' usage)",
                              [*labels, "kind"], registry=self.registry)  # fmt: skip
        self.in_flight = Gauge("tcc_router_in_flight", "Requests in flight per replica", ["replica"],
                               registry=self.registry)  # fmt: skip
        self.queued = Gauge("tcc_router_queued", "Requests waiting for a free replica, per endpoint", ["endpoint_id"],
                            registry=self.registry)  # fmt: skip

    def count_usage(self, project, endpoint, body):
        try:
            usage = json.loads(body).get("usage") or {}
        except (ValueError, AttributeError):
            return
        for kind in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(kind), int):
                self.tokens.labels(project, endpoint, kind.removesuffix("_tokens")).inc(usage[kind])

    def text(self):
        from prometheus_client import generate_latest

        self.in_flight.clear()
        for replica_id, count in self.router.in_flight.items():
            self.in_flight.labels(str(replica_id)).set(count)
        self.queued.clear()
        for endpoint_id, count in self.router.waiting.items():
            self.queued.labels(str(endpoint_id)).set(count)
        return generate_latest(self.registry)


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
        self.indexed, self.by_id = None, {}  # the table current() indexed by endpoint id, and that index
        self.in_flight = {}  # replica id -> requests in flight
        self.waiting = {}  # endpoint id -> requests queued for a free replica
        self.peak = {}  # endpoint id -> most requests queued at once since the last sample
        self.failed_probes = {}  # replica id -> /health failures in a row
        self.ejected = set()  # replica ids out of the routing until their /health passes again
        self.freed = {}  # endpoint id -> asyncio.Condition, notified when one of its requests ends
        self.suspect = {}  # replica id -> monotonic time until which it is skipped
        self.stats = {}  # endpoint id -> Stats
        self.tokens = TokenCache(settings.ROUTER_TOKEN_CACHE_SIZE, settings.ROUTER_TOKEN_CACHE_SECONDS)
        self.session = None
        self.interval_started = time.monotonic()
        self.metrics = Metrics(self)

    # -- the console's database, in a thread --------------------------------------------------

    def load_routes(self):
        routes = {}
        endpoints = Endpoint.objects.filter(status__in=EndpointStatus.live()).select_related("project", "serving")
        replicas = {}
        for endpoint_id, replica_id, host, port, version, token in (
            Endpoint.objects.filter(status__in=EndpointStatus.live(), replicas__state=ReplicaState.READY)
            .values_list("pk", "replicas__pk", "replicas__host", "replicas__port", "replicas__version_ref",
                         "replicas__token")
        ):  # fmt: skip
            replicas.setdefault(endpoint_id, []).append((replica_id, f"http://{host}:{port}", version, token))
        for endpoint in endpoints:
            served = endpoint.serving.ref if endpoint.serving else ""
            names = (endpoint.name, served, f"{endpoint.model_name}@{endpoint.alias}" if endpoint.alias else "")
            routes[(endpoint.project.slug, endpoint.name)] = Route(
                endpoint.pk, endpoint.project_id, replicas.get(endpoint.pk, []), served, endpoint.name,
                tuple(n for n in names if n),
            )  # fmt: skip
        return routes

    def check_token(self, raw):
        """(user id, {project ids the token reaches}) or None (clusters.access, as for every page)."""
        return access.token_projects(raw)

    def write_samples(self, stats, seconds, routed, peaks=None):
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
                queued=(peaks or {}).get(endpoint_id, 0),
            )
            for endpoint_id, s in stats.items()
        ]
        EndpointSample.objects.bulk_create(rows)

    # -- loops ----------------------------------------------------------------------------------

    async def refresh_forever(self):
        while True:
            try:
                self.routes = await asyncio.to_thread(self.load_routes)
                await self.wake_waiting()
            except Exception:  # a database hiccup: keep the last table
                log.exception("could not read the routing table")
            await asyncio.sleep(settings.ROUTER_REFRESH_SECONDS)

    async def probe(self, replica_id, url):
        try:
            timeout = ClientTimeout(total=settings.ROUTER_HEALTH_SECONDS)
            async with self.session.get(url + "/health", timeout=timeout) as answer:
                healthy = answer.status == 200
        except (TimeoutError, ClientConnectionError):
            healthy = False
        if healthy:
            self.failed_probes.pop(replica_id, None)
            if replica_id in self.ejected:
                self.ejected.discard(replica_id)
                log.info("replica %s passes /health again: routed", replica_id)
            return
        self.failed_probes[replica_id] = self.failed_probes.get(replica_id, 0) + 1
        if self.failed_probes[replica_id] >= settings.ROUTER_HEALTH_EJECT_AFTER and replica_id not in self.ejected:
            self.ejected.add(replica_id)
            log.warning("replica %s failed /health %s times: ejected", replica_id, self.failed_probes[replica_id])

    async def check_health(self):
        """Probe every routed replica's /health once, all at once."""
        replicas = {r[0]: r[1] for route in self.routes.values() for r in route.replicas}
        await asyncio.gather(*(self.probe(replica_id, url) for replica_id, url in replicas.items()))
        self.ejected &= set(replicas)  # forget replicas that left the table

    async def health_forever(self):
        while True:
            await asyncio.sleep(settings.ROUTER_HEALTH_SECONDS)
            try:
                await self.check_health()
            except Exception:
                log.exception("could not probe the replicas")

    async def sample_forever(self):
        while True:
            await asyncio.sleep(settings.ROUTER_SAMPLE_SECONDS)
            now = time.monotonic()
            seconds, self.interval_started = now - self.interval_started, now
            stats, self.stats = self.stats, {}
            peaks, self.peak = self.peak, {}
            for route in self.routes.values():  # an endpoint with no traffic still has a sample (idle)
                stats.setdefault(route.endpoint_id, Stats())
            routed = {route.endpoint_id: len(route.replicas) for route in self.routes.values()}
            try:
                await asyncio.to_thread(self.write_samples, stats, seconds, routed, peaks)
            except Exception:
                log.exception("could not write the samples")

    # -- requests -------------------------------------------------------------------------------

    async def token(self, request):
        """(user id, {project ids}) of the request's token, or None for a missing or bad one."""
        header = request.headers.get("Authorization", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not raw:
            return None
        hit, found = self.tokens.get(raw)
        if not hit:
            found = await asyncio.to_thread(self.check_token, raw)
            self.tokens.put(raw, found)
        return found

    def current(self, route):
        """The endpoint's route in the latest table: a request that waited in the queue, or is retried,
        holds the table of its arrival, which may name replicas drained since (no replica once the
        endpoint left the table)."""
        if self.indexed is not self.routes:
            self.indexed, self.by_id = self.routes, {r.endpoint_id: r for r in self.routes.values()}
        return self.by_id.get(route.endpoint_id) or replace(route, replicas=[])

    def pick(self, route, tried):
        """The least loaded replica not tried yet with room for one more request (a suspect one only
        when no other has room), None when no replica is left to try, or FULL."""
        now, limit = time.monotonic(), settings.ROUTER_REPLICA_CONCURRENCY
        untried = [r for r in route.replicas if r[0] not in tried and r[0] not in self.ejected]
        if not untried:
            return None
        room = [r for r in untried if self.in_flight.get(r[0], 0) < limit]
        if not room:
            return FULL
        choices = [r for r in room if self.suspect.get(r[0], 0) < now] or room
        return min(choices, key=lambda choice: self.in_flight.get(choice[0], 0))

    async def take(self, route, tried):
        """pick(), waiting in the endpoint's bounded queue while every replica is full: a replica,
        None, or FULL when the queue is full or the wait ran out."""
        chosen = self.pick(route, tried)
        if chosen is not FULL:
            return chosen
        key = route.endpoint_id
        if self.waiting.get(key, 0) >= settings.ROUTER_QUEUE_PER_REPLICA * len(route.replicas):
            return FULL
        freed = self.freed.setdefault(key, asyncio.Condition())
        deadline = time.monotonic() + settings.ROUTER_QUEUE_SECONDS
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self.peak[key] = max(self.peak.get(key, 0), self.waiting[key])
        try:
            async with freed:
                while (chosen := self.pick(self.current(route), tried)) is FULL:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return FULL
                    try:
                        await asyncio.wait_for(freed.wait(), remaining)
                    except TimeoutError:
                        return FULL
            return chosen
        finally:
            self.waiting[key] -= 1

    async def wake_waiting(self):
        """After a new table: queued requests look again, since it may have room they can take now (a
        replica a scale or a roll added) and no longer has the replicas being drained."""
        for endpoint_id, count in list(self.waiting.items()):
            freed = self.freed.get(endpoint_id)
            if count and freed is not None:
                async with freed:
                    freed.notify_all()

    async def release(self, route, replica_id):
        self.in_flight[replica_id] -= 1
        freed = self.freed.get(route.endpoint_id)
        if freed is not None and self.waiting.get(route.endpoint_id):
            async with freed:
                freed.notify()

    async def forward(self, route, method, path, body, stream_to=None, on_first=None):
        """(status, JSON body, version) from a replica. Retried on another replica only when the request
        never reached one (connecting failed); after that, a reset or a timeout is a 502 or 504, since
        the replica may have started the work. With `stream_to` (the client's request), a 200 is
        relayed as it comes and the body returned is that StreamResponse."""
        tried = set()
        for _ in range(max(1, min(3, len(route.replicas)))):
            chosen = await self.take(self.current(route), tried)
            if chosen is FULL:
                message = f"every replica of this endpoint is busy and its queue is full; retry after {retry_after()} s"
                return failure(message, 429, code="rate_limit_exceeded")
            if chosen is None:
                break
            replica_id, url, version, token = chosen
            tried.add(replica_id)
            self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                async with self.session.request(method, url + path, data=body, headers=headers) as answer:
                    # vLLM's answers do not name the version; the table does.
                    version = answer.headers.get("X-Model-Version") or version
                    if stream_to is not None and answer.status == 200:
                        return answer.status, await relay(answer, stream_to, version, on_first), version
                    return answer.status, await answer.read(), version
            except ClientConnectorError:  # nothing was sent: another replica may take it
                self.suspect[replica_id] = time.monotonic() + 5
                continue
            except TimeoutError:
                return failure("the replica did not answer in time", 504)
            except ClientConnectionError:
                return failure("the replica closed the connection", 502)
            finally:
                await self.release(route, replica_id)
        return failure("no replica of this endpoint is serving yet", 503)

    def models(self, route):
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "tcc"} for name in route.names]
        return 200, json.dumps({"object": "list", "data": data}).encode(), route.version

    def rewrite(self, route, raw):
        """(body for the replica, stream?); Refused when it is not a JSON object or its `model` is not
        one of the endpoint's names (it becomes the one the replicas serve)."""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise Refused("the body must be JSON", 400) from None
        if not isinstance(body, dict):
            raise Refused("the body must be a JSON object", 400)
        asked = body.get("model", route.name)
        if asked not in route.names:
            message = f"The model `{asked}` does not exist on this endpoint; use one of: {', '.join(route.names)}"
            raise Refused(message, 404, param="model", code="model_not_found")
        body["model"] = route.name
        return json.dumps(body).encode(), body.get("stream") is True

    async def handle(self, request):
        started = time.monotonic()
        project, name, rest = request.match_info["project"], request.match_info["endpoint"], request.match_info["rest"]
        token = await self.token(request)
        if token is None:
            message = "Incorrect API key provided: use a console API token (Authorization: Bearer ...)"
            return json_response(401, error_body(message, 401, code="invalid_api_key"))
        route = self.routes.get((project, name))
        if route is None or route.project_id not in token[1]:
            return json_response(404, error_body("no such endpoint", 404))
        stats = self.stats.setdefault(route.endpoint_id, Stats())
        status = 500
        try:
            if rest == ":predict" and request.method == "POST":
                status, body, version = await self.predict(route, await request.read())
            elif rest in ("/v1/completions", "/v1/chat/completions") and request.method == "POST":
                try:
                    payload, streaming = self.rewrite(route, await request.read())
                except Refused as refused:
                    status, body, version = refused.answer
                else:

                    def first_chunk():
                        self.metrics.first_token.labels(project, name).observe(time.monotonic() - started)

                    status, body, version = await self.forward(
                        route, "POST", rest, payload, stream_to=request if streaming else None, on_first=first_chunk
                    )
                    if isinstance(body, web.StreamResponse):  # relayed as it came
                        return body
                    if status == 200:
                        self.metrics.count_usage(project, name, body)
            elif rest == "/v1/models" and request.method == "GET":
                status, body, version = self.models(route)
            else:
                status, body, version = failure("no such path", 404)
            response = web.Response(status=status, body=body, content_type="application/json")
            if status == 429:
                response.headers["Retry-After"] = str(retry_after())
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
            self.metrics.requests.labels(project, name, str(status)).inc()
            self.metrics.latency.labels(project, name).observe(elapsed)

    async def scrape(self, request):
        """GET /metrics: Prometheus' text format, for the bearer METRICS_TOKEN_FILE holds (404 without one)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        allowed = scrape_allowed(request.headers.get("Authorization", ""))
        if allowed is None:
            return json_response(404, error_body("no such path", 404))
        if not allowed:
            return json_response(401, error_body("/metrics needs the scrape token", 401, code="invalid_api_key"))
        body = await asyncio.to_thread(self.metrics.text)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

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
        # One pool for every replica: ROUTER_MAX_CONNECTIONS at once (aiohttp's default is 100, which
        # queued the 101st concurrent request), kept alive between requests.
        connector = TCPConnector(limit=settings.ROUTER_MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=30)
        timeout = ClientTimeout(total=settings.ROUTER_REQUEST_TIMEOUT, sock_connect=settings.ROUTER_CONNECT_TIMEOUT)
        self.session = ClientSession(connector=connector, timeout=timeout)
        self.routes = await asyncio.to_thread(self.load_routes)
        app[TASKS] = [
            asyncio.create_task(self.refresh_forever()),
            asyncio.create_task(self.sample_forever()),
            asyncio.create_task(self.health_forever()),
        ]

    async def stop(self, app):
        for task in app[TASKS]:
            task.cancel()
        await self.session.close()


FULL = "full"  # pick() and take(): every replica has ROUTER_REPLICA_CONCURRENCY requests
STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip


def retry_after():
    """Seconds a client refused with 429 should wait: a tenth of the longest queue wait."""
    return max(1, round(settings.ROUTER_QUEUE_SECONDS / 10))


def error_body(message, http, param=None, code=None):
    """OpenAI's error shape (message, type, param, code), with google.rpc's status beside it (the
    :predict callers' shape)."""
    kind = {429: "requests"}.get(http, "invalid_request_error" if http in (400, 401, 404) else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code or http,
                      "status": STATUS.get(http, "INTERNAL")}}  # fmt: skip


class Refused(Exception):
    """A request the router answers itself; `answer` is failure()'s (status, body, version)."""

    def __init__(self, message, http, param=None, code=None):
        super().__init__(message)
        self.answer = failure(message, http, param, code)


def failure(message, http, param=None, code=None):
    """(status, body, version) of a refusal the router answers itself."""
    return http, json.dumps(error_body(message, http, param, code)).encode(), ""


async def relay(answer, request, version, on_first=None):
    """The replica's 200 (server-sent events) to the client as it comes: a StreamResponse. A client
    that goes away cancels this handler; leaving `answer` closes the replica's connection, and the
    replica stops generating."""
    response = web.StreamResponse(status=200, headers={"Content-Type": answer.headers.get("Content-Type", "")})
    response.headers["Cache-Control"] = "no-cache"
    if version:
        response.headers["X-Model-Version"] = version
    await response.prepare(request)
    async for data in answer.content.iter_any():
        if on_first is not None:
            on_first()
            on_first = None
        await response.write(data)
    await response.write_eof()
    return response


def json_response(status, body):
    return web.json_response(body, status=status)


ROUTER = web.AppKey("router", Router)  # the application's router (tests reach its state through it)
TASKS = web.AppKey("tasks", list)  # its loops: table refresh, samples, health probes


def application():
    router = Router()
    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/metrics", router.scrape)
    app.router.add_route("*", r"/{project:[a-z0-9-]+}/{endpoint:[a-z0-9-]+}{rest:(:predict|/.*)}", router.handle)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    app[ROUTER] = router
    return app


# New connections a burst may leave waiting for accept() while the loop is busy (hundreds of clients
# connecting at once): aiohttp's default of 128 had the kernel drop the SYNs beyond it, each retried by
# the client 1 s later (then 3, 7, ... s). The kernel caps it at net.core.somaxconn (4096 by default).
BACKLOG = 4096


def serve(host, port):
    web.run_app(application(), host=host, port=port, access_log=None, print=lambda *_: None, backlog=BACKLOG)
