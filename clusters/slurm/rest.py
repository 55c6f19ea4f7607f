"""The console's one client for a cluster's slurmrestd (openapi/v0.0.38), for every backend.

The console signs its own JWTs (HS256) with the cluster's JWT key, for the Slurm user it acts as:
the service account (root) for the sync, cancels and node updates, a user's POSIX account for what a
user submits. No Slurm client program runs on the console's host, so the console needs only an HTTP
route to the controller (docs/backends.md, "How the console reaches a cluster").

    client = SlurmRest(endpoint)                 # endpoint: SlurmEndpoint(url, jwt_key)
    client.nodes() -> [NodeStatus]   client.jobs() -> [JobStatus]   client.job(id) -> JobStatus | None
    client.submit(script, job, user=...) -> job id   client.cancel(id)   client.ping()   client.reservations()
    client.request(method, path, body, user=...) -> (status, raw body)
"""

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from ..tls import context_for, unreachable
from ..work import PermanentBackendError, TransientBackendError
from .parse import jobs_from, nodes_from

API = "/slurm/v0.0.38"
SERVICE_USER = "root"  # what the console's own calls run as in Slurm


@dataclass(frozen=True)
class SlurmEndpoint:
    """Where a cluster's slurmrestd answers and the key its JWTs are signed with (never shown)."""

    url: str  # e.g. https://127.0.0.1:6820 (the cluster agent's TLS relay to slurmrestd)
    jwt_key: bytes = field(repr=False)
    ca: str = ""  # the cluster's CA certificate (PEM), the only one the relay's certificate may chain to


def b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def mint_token(key, user, lifespan=300, now=None):
    """An HS256 JWT Slurm's auth/jwt accepts for `user` (claims sun, iat, exp)."""
    now = int(now if now is not None else time.time())
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"iat": now, "exp": now + lifespan, "sun": user}
    payload = b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = b64url(hmac.new(key, header + b"." + payload, hashlib.sha256).digest())
    return (header + b"." + payload + b"." + signature).decode()


class SlurmRest:
    def __init__(self, endpoint, timeout=20):
        self.endpoint, self.timeout = endpoint, timeout

    def request(self, method, path, body=None, user=SERVICE_USER):
        """(HTTP status, raw body) of one request as `user`; TransientBackendError when unreachable."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.endpoint.url.rstrip("/") + path,
            data=data,
            method=method,
            headers={
                "X-SLURM-USER-NAME": user,
                "X-SLURM-USER-TOKEN": mint_token(self.endpoint.jwt_key, user),
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context_for(self.endpoint)) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (OSError, ValueError) as exc:
            raise TransientBackendError(unreachable("slurmrestd", exc)) from None

    def call(self, method, path, body=None, user=SERVICE_USER, what=None, queued_ok=False):
        """The JSON answer of a request that must succeed; Slurm's "errors" become an exception. With
        `queued_ok`, a submit that got a job id succeeded whatever its "errors" say: they are why the
        job cannot start yet (e.g. 2068 "Required node not available" for a held node), and the job
        waits in the queue, as it does after sbatch."""
        status, raw = self.request(method, path, body, user=user)
        what = what or f"{method} {path}"
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise TransientBackendError(f"{what}: slurmrestd answered {status} with no JSON") from None
        errors = (data.get("errors") or []) if isinstance(data, dict) else []
        if queued_ok and status < 400 and isinstance(data, dict) and data.get("job_id"):
            return data
        if status >= 400 or errors:
            first = errors[0] if errors else {}
            detail = first.get("description") or first.get("error") or f"HTTP {status}"
            error = PermanentBackendError if status in (400, 401, 403, 404) else TransientBackendError
            raise error(f"{what} failed: {detail}")
        return data

    def nodes(self):
        return nodes_from(self.call("GET", f"{API}/nodes", what="slurmrestd nodes"))

    def jobs(self):
        return jobs_from(self.call("GET", f"{API}/jobs", what="slurmrestd jobs"))

    def job(self, job_id):
        """The job while Slurm still knows it, else None."""
        status, raw = self.request("GET", f"{API}/job/{int(job_id)}")
        if status >= 400:
            return None  # Slurm has forgotten the job (older than MinJobAge)
        return next((job for job in jobs_from(json.loads(raw or b"{}")) if job.job_id == int(job_id)), None)

    def ping(self):
        """Whether slurmrestd answers and its slurmctld is up."""
        try:
            pings = self.call("GET", f"{API}/ping", what="slurmrestd ping").get("pings") or []
        except TransientBackendError:
            return False
        return any(str(p.get("ping", "")).upper() == "UP" for p in pings)

    def reservations(self):
        """{name: node list} of the reservations Slurm has now."""
        data = self.call("GET", f"{API}/reservations", what="slurmrestd reservations")
        return {r["name"]: r.get("node_list", "") for r in data.get("reservations") or []}

    def submit(self, script, job, user=SERVICE_USER):
        """Submit `script` with `job` (slurmrestd's job properties, see batch.py) as `user`; the job id."""
        data = self.call(
            "POST", f"{API}/job/submit", {"script": script, "job": job}, user=user, what="sbatch", queued_ok=True
        )
        return int(data["job_id"])

    def cancel(self, job_id, user=SERVICE_USER):
        self.call("DELETE", f"{API}/job/{int(job_id)}", user=user, what=f"scancel {int(job_id)}")
