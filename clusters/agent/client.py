"""The console's client for a cluster agent (server.py): files under the cluster's shared home.

agent = AgentClient(AgentEndpoint(url, key))
agent.stat("runs/7/result.json") -> {"exists", "size", "is_dir"}
agent.read("runs/7/metrics.jsonl", offset=0, limit=1 << 20) -> bytes
agent.tail("runs/7/slurm-12.out", lines=40) -> str
agent.list("runs/7", "slurm-*.out") -> [names]
agent.write("runs/7/config.json", b"...", mode=0o640)
agent.write("models/x/v1.partial/model.safetensors", b"...", offset=4 << 20)  # appends a part
agent.move("models/x/v1.partial", "models/x/v1")
agent.upload("runs/7/checkpoints/step-9/__0_0.distcp", url, offset=0, length=128 << 20)  # -> {"etag", ...}
agent.uploads("runs/7/...", [(1, url1, 0, n, {}), (2, url2, n, n, {})], at_once=4)  # -> (1, {...}), (2, ...)
agent.own("runs/7", "tcc-alice", "tcc-p-lab")     # the run's folder becomes the user's
agent.prune("scans", older_than=1767225600)        # entries of the folder older than that go
agent.account("tcc-alice-3", "tcc-p-lab-1")          # the user's account, in the group owning the home
agent.slurm("drain", node="cpu-1", reason="...")  # drain, down, resume, reconfigure, hold, release
agent.tls(bundle)                                  # serve a new TLS key and certificate (a rotation)
"""

import base64
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from ..tls import context_for, unreachable
from ..work import PermanentBackendError, TransientBackendError

UPLOAD_WAIT = 900  # seconds for one part's upload: the agent answers when the store has the part


@dataclass(frozen=True)
class AgentEndpoint:
    url: str  # https://HOST:PORT
    key: str = field(repr=False)  # hex; never logged or shown
    ca: str = ""  # the cluster's CA certificate (PEM), the only one its agent's certificate may chain to


class AgentRefused(PermanentBackendError):
    """The agent answered but refused (unknown operation, a path outside the home, no such file)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def refusal(exc, what):
    """The AgentRefused for the agent's error answer `exc` (its JSON {"error": ...}) to a request for `what`."""
    try:
        message = json.loads(exc.read()).get("error", "")
    except ValueError:
        message = ""
    return AgentRefused(exc.code, f"the cluster agent refused {what}: {message or exc.code}")


class AgentClient:
    def __init__(self, endpoint, timeout=20):
        self.endpoint, self.timeout = endpoint, timeout

    def call(self, operation, timeout=None, **body):
        request = urllib.request.Request(
            f"{self.endpoint.url.rstrip('/')}/v1/{operation}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.endpoint.key}", "Content-Type": "application/json"},
        )
        try:
            wait = timeout or self.timeout
            with urllib.request.urlopen(request, timeout=wait, context=context_for(self.endpoint)) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise refusal(exc, operation) from None
        except (OSError, ValueError) as exc:
            raise TransientBackendError(unreachable("the cluster agent", exc)) from None

    def stat(self, path):
        return self.call("stat", path=path)

    def read(self, path, offset=0, limit=1 << 20):
        return base64.b64decode(self.call("read", path=path, offset=offset, limit=limit)["data"])

    def tail(self, path, lines=40):
        return self.call("tail", path=path, lines=lines)["text"]

    def list(self, path, pattern="*"):
        return self.call("list", path=path, pattern=pattern)["names"]

    def tensorboard(self, path_prefix):
        """Start the cluster's TensorBoard if need be (on a Unix socket only the agent reaches)."""
        self.call("tensorboard", action="start", path_prefix=path_prefix)

    def relay_tensorboard(self, path_prefix, method, path, body=None, content_type=""):
        """(status, [(header, value)], body) of the cluster's TensorBoard for one request, through the agent
        (which starts it first if need be). TensorBoard's own errors (a 404) come back as answers; the agent's
        refusals raise as every call's do."""
        request = urllib.request.Request(
            f"{self.endpoint.url.rstrip('/')}/tensorboard/{path}",
            data=body,
            method=method,
            headers={
                "Authorization": f"Bearer {self.endpoint.key}",
                "X-TensorBoard-Prefix": path_prefix,
                **({"Content-Type": content_type} if body is not None and content_type else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60, context=context_for(self.endpoint)) as response:
                return response.status, list(response.headers.items()), response.read()
        except urllib.error.HTTPError as exc:
            if exc.headers.get("X-Agent-Error"):
                raise refusal(exc, "TensorBoard") from None
            return exc.code, list(exc.headers.items()), exc.read()
        except (OSError, ValueError) as exc:
            raise TransientBackendError(unreachable("the cluster agent", exc)) from None

    def stop_tensorboard(self):
        self.call("tensorboard", action="stop")

    def write(self, path, data, mode=0o640, offset=0):
        body = {"path": path, "data": base64.b64encode(data).decode(), "mode": mode}
        return self.call("write", **body, **({"offset": offset} if offset else {}))

    def upload(self, path, url, offset, length, headers=None):
        """The agent PUTs the file's bytes [offset, offset + length) to `url` (a signed part URL); the
        part's {"etag", "bytes"}. Waits as long as a part of up to 5 GiB may take."""
        return self.call("upload", timeout=UPLOAD_WAIT, path=path, url=url, offset=offset, length=length,
                         headers=headers or {})  # fmt: skip

    def uploads(self, path, parts, at_once=1):
        """upload() for each of `parts` ((key, url, offset, length, headers)), `at_once` in flight at a time
        (the agent serves each call in a thread of its own); yields (key, answer) as each ends. The first
        error is raised: parts not yet begun are dropped, those under way end on their own."""
        pool = ThreadPoolExecutor(max_workers=max(1, at_once), thread_name_prefix="upload-part")
        try:
            sending = {pool.submit(self.upload, path, url, offset, length, headers): key
                       for key, url, offset, length, headers in parts}  # fmt: skip
            for done in as_completed(sending):
                yield sending[done], done.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def move(self, path, to):
        return self.call("move", path=path, to=to)

    def own(self, path, user, group=None):
        return self.call("own", path=path, user=user, **({"group": group} if group else {}))

    def prune(self, path, older_than):
        """Remove the folder's entries last changed before `older_than` (Unix time); how many went."""
        return self.call("prune", path=path, older_than=int(older_than))["removed"]

    def account(self, user, group):
        return self.call("account", user=user, group=group)

    def leave(self, user, group):
        """The account leaves the project's group and its jobs are cancelled (a member who left)."""
        return self.call("leave", user=user, group=group)

    def tls(self, bundle):
        """Serve this PEM bundle (bytes: the controller's new key and certificate, its CA's) from now on."""
        return self.call("tls", bundle=bundle.decode())

    def slurm(self, action, **arguments):
        """One of the Slurm actions slurmrestd 0.0.38 lacks, run by the agent beside slurmctld."""
        return self.call("slurm", action=action, **arguments)
