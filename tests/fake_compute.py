"""A fake Google Cloud API server: the REST shapes google-cloud-compute, -filestore and -lustre use.

It keeps resources in memory and answers on 127.0.0.1 only:

- Compute (`/compute/v1/projects/P/{global|regions/R|zones/Z}/COLLECTION[/NAME]`): insert, get, list
  (with a `labels.KEY = "VALUE"` filter), delete, `instances/bulkInsert`, and zone, region and
  global operations (get and wait). Operations finish at once.
- Filestore (`/file/v1/...`) and Managed Lustre (`/lustre/v1/...`, each client given that prefix in
  its endpoint): create, get, delete of `projects/P/locations/L/instances` with google.longrunning
  operations.
- Service Networking (`/v1/services/servicenetworking.googleapis.com/connections`): create, list, delete.
- Secret Manager (`/sm/v1/projects/P/secrets`): create, get, delete, addVersion, list versions, access,
  destroy a version (its data gone: accessing it is a 400 FAILED_PRECONDITION).
- `instances/NAME/setMetadata`, with the fingerprint check Compute makes.
- `instances/NAME/reset`, `/start` and `/stop` (counted on the instance as `resets` / `starts` / `stops`).
- With `boot=True`, every instance boots (tests/fake_vms.py): its real startup script runs in a VM of
  namespaces on a bridge, reading the metadata server this fake serves (`/computeMetadata/v1/...`:
  attributes with `wait_for_change` and ETags, name, project, network address, the service account's
  token), and its serial console is what it printed. The fake then answers on the bridge's gateway,
  which both the console and the VMs reach. reset, stop, start and delete power VMs off and on.

Errors are injected with `inject()`: an HTTP error, or an operation that ends with an error, for the
next N requests matching a method and a path pattern. Every request is counted in `calls`.
"""

import copy
import hashlib
import ipaddress
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from . import fake_rules
from .fake_vms import VPC

COMPUTE = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<scope>global|regions/[^/]+|zones/[^/]+)/(?P<rest>.+)$"
)
REGION = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)$")
SERVICES = re.compile(r"^/v1/projects/(?P<project>[^/]+)/services$")
LOCATIONS = re.compile(
    r"^/(?P<service>file|lustre)/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/(?P<rest>.+)$"
)
SECRETS = re.compile(
    r"^/sm/v1/projects/(?P<project>[^/]+)/secrets(?:/(?P<secret>[^/:]+))?(?:/versions(?:/(?P<version>[^/:]+))?)?(?::(?P<verb>\w+))?$"
)
SERVICE_ACCOUNTS = re.compile(r"^/v1/projects/(?P<project>[^/]+)/serviceAccounts(?:/(?P<email>[^/:]+))?$")
PROJECT_POLICY = re.compile(r"^/v3/projects/(?P<project>[^/:]+):(?P<verb>getIamPolicy|setIamPolicy)$")
# https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/create: accountId "must be
# 6-30 characters long, and match the regular expression [a-z]([-a-z0-9]*[a-z0-9])".
# The booting fake's console network (in a project of its own, as a console's host project would be).
CONSOLE_NETWORK = "projects/console-host/global/networks/console"
ACCOUNT_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])\Z")
SERIAL_DONE = "google_metadata_script_runner[812]: startup-script: tcc-startup: done\n"
INSTANCE_TYPES = {"file": "google.cloud.filestore.v1.Instance", "lustre": "google.cloud.lustre.v1.Instance"}
FILTER = re.compile(r'labels\.(?P<key>[\w-]+)\s*=\s*"?(?P<value>[^"\s)]+)"?')


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Every booting VM's metadata reads, long polls and Secret Manager calls at once: with Python's default
    # backlog of 5 the kernel dropped SYNs beyond it, and a dropped one was retried 1, 3, 7 ... s later (a
    # node's read once failed after the 127 s of every retry).
    request_queue_size = 1024


class Injection:
    def __init__(self, method, pattern, times, http_status=None, code="", message=""):
        self.method, self.pattern, self.times = method, re.compile(pattern), times
        self.http_status, self.code, self.message = http_status, code, message


class FakeGoogleCloud:
    def __init__(self, boot=False, root=None):
        self.resources = {}  # path without query -> resource JSON
        self.operations = {}
        self.secret_versions = {}  # secret name -> [payload, ...]
        self.iam = {}  # secret name, gcs:BUCKET or project:P -> IAM policy ({"bindings": [{"role", "members"}]})
        # IAM is eventually consistent: a new service account is seen (read back, named in a policy or by
        # a VM) only this many seconds after it was made.
        self.iam_propagation_seconds = 0.0
        self.calls = Counter()
        self.injections = []
        self.lock = threading.Lock()
        self.counter = 0
        # Preflight's view: Service Usage's enabled APIs, and each region's quotas (metric, limit, usage).
        self.enabled_services = {
            "compute.googleapis.com", "secretmanager.googleapis.com", "file.googleapis.com",
            "lustre.googleapis.com", "servicenetworking.googleapis.com", "iam.googleapis.com",
        }  # fmt: skip
        self.region_quotas = {}
        # What creates meet: regional quotas {(region, metric): limit} enforced on every insert, and stockouts
        # {(zone, machine type)}: those VMs cannot be made until the entry goes.
        self.quotas = {}
        self.stockouts = set()
        # Operations take time: a new one is PENDING, each GET moves it a step (RUNNING, then DONE), and
        # `wait` (a long poll on the real API) answers when it is DONE. 0: operations are DONE at once.
        self.operation_steps = 2
        self.changed = threading.Condition(self.lock)  # metadata waits (wait_for_change)
        # VM changes are applied in the order of the requests that asked for them, by ticket (locked()).
        self.turns = threading.Condition()
        self.tickets = self.serving = 0
        self.vpc = VPC(root) if boot else None
        # Where the console's workers are (booting only): a network of their own, reaching a cluster's VPC
        # only through a peering (_routed).
        self.console_network = CONSOLE_NETWORK if boot else None
        if boot:
            self.resources[f"/compute/v1/{CONSOLE_NETWORK}"] = {
                "name": CONSOLE_NETWORK.rsplit("/", 1)[1],
                "peerings": [],
            }
        # VM changes a request makes (boot, halt, destroy), run in order once the lock is released: a boot
        # copies /etc (seconds under load), and every VM's metadata read waited on the lock meanwhile.
        self.vm_changes = []
        self.addresses = {}  # instance internal address -> resource key
        # {instance name: n}: its metadata server answers 503 to the next n requests after the startup script's
        # own fetch (the guest agent's), as the real one can while a VM starts.
        self.metadata_outages = {}
        self.server = Server((self.vpc.gateway if boot else "127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self):
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def metadata_host(self):
        return "{}:{}".format(*self.server.server_address[:2])

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        if self.vpc is not None:
            self.vpc.close()

    def inject(self, method, pattern, *, times=1, http_status=None, code="", message=""):
        """Fail the next `times` requests: with `http_status` as an HTTP error, else as a failed operation."""
        self.injections.append(Injection(method, pattern, times, http_status, code, message))

    def take_back(self, name):
        """What Compute does to a Spot or Flex-start VM it takes back (termination action DELETE)."""

        def delete():
            key = next(k for k in self.instances() if k.endswith(f"/instances/{name}"))
            del self.resources[key]
            self._vm_change("destroy", name)

        self.locked(delete)

    def locked(self, work, *args):
        """work(*args) under the lock, then the VM changes it asked for, in order, without the lock: metadata
        reads and other requests go on meanwhile (booting a VM copies its disk and sets up its network: seconds
        on a loaded machine, and a VM whose metadata read waited that long started late). The ticket taken
        under the lock keeps the changes in the order of their requests (a delete after a create)."""
        with self.lock:
            try:
                result = work(*args)
            except BaseException:
                self.vm_changes = []
                raise
            changes, self.vm_changes = self.vm_changes, []
            if changes:
                ticket, self.tickets = self.tickets, self.tickets + 1
        if changes:
            with self.turns:
                self.turns.wait_for(lambda: self.serving == ticket)
            try:
                with self.vpc.lock:
                    for change, change_args in changes:
                        getattr(self.vpc, change)(*change_args)
            finally:
                with self.turns:
                    self.serving += 1
                    self.turns.notify_all()
        return result

    def _vm_change(self, change, *args):
        """Ask for the VPC's `change` (boot, halt or destroy) of a VM once the lock is released."""
        if self.vpc is not None:
            self.vm_changes.append((change, args))

    def reset_calls(self):
        self.calls.clear()

    def instances(self):
        return {p: r for p, r in self.resources.items() if p.startswith("/compute/") and "/instances/" in p}

    def settings(self):
        """The console's gce settings that point every Google client at this fake. Without booting VMs
        the console only provisions (GCE_REACH_CLUSTERS off: nothing answers on a controller)."""
        return {
            "GCE_API_ENDPOINT": self.endpoint,
            "GCE_FILESTORE_ENDPOINT": f"{self.endpoint}/file",
            "GCE_LUSTRE_ENDPOINT": f"{self.endpoint}/lustre",
            "GCE_SERVICE_NETWORKING_ENDPOINT": self.endpoint,
            "GCE_RESOURCE_MANAGER_ENDPOINT": self.endpoint,
            "GCE_STORAGE_ENDPOINT": self.endpoint,
            "GCE_IAM_ENDPOINT": self.endpoint,
            "GCE_SECRET_MANAGER_ENDPOINT": f"{self.endpoint}/sm",
            "GCE_ANONYMOUS": True,
            # Booted VMs are polled through their slurmrestd: not a hundred times a second.
            "GCE_POLL_INTERVAL": 0.2 if self.vpc is not None else 0.01,
            "GCE_REACH_CLUSTERS": self.vpc is not None,
            # The console reaches the VMs from this machine, on the fake VPC's bridge.
            "GCE_CONSOLE_RANGES": [f"{self.vpc.subnet}.0/24"] if self.vpc is not None else [],
            "GCE_CONSOLE_NETWORK": self.console_network or "",
        }

    def configure(self, settings):
        """Point a Django settings object's gce endpoints at this fake."""
        for name, value in self.settings().items():
            setattr(settings, name, value)

    # -- request handling ----------------------------------------------------------------------

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}") if length else {}

            def _answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _dispatch(self, method):
                url = urlparse(self.path)
                if url.path.startswith("/computeMetadata/"):
                    status, text, etag = fake.metadata(url.path, parse_qs(url.query), self.client_address[0],
                                                       self.headers.get("Metadata-Flavor"))  # fmt: skip
                    data = text.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/text")
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                body = self._body() if method in ("POST", "PATCH", "PUT") else {}
                status, payload = fake.locked(fake.handle, method, url.path, parse_qs(url.query), body,
                                              self.headers.get("Authorization", ""))  # fmt: skip
                self._answer(status, payload)

            def do_GET(self):
                self._dispatch("GET")

            def do_POST(self):
                self._dispatch("POST")

            def do_DELETE(self):
                self._dispatch("DELETE")

            def do_PATCH(self):
                self._dispatch("PATCH")

            def do_PUT(self):
                self._dispatch("PUT")

        return Handler

    def _injected(self, method, path):
        for injection in self.injections:
            if injection.times > 0 and injection.method == method and injection.pattern.search(path):
                injection.times -= 1
                return injection
        return None

    def handle(self, method, path, query, body, authorization=""):
        kind = self._kind(method, path)
        self.calls[kind] += 1
        injection = self._injected(method, path)
        if injection and injection.http_status:
            return injection.http_status, http_error(injection.http_status, injection.message, injection.code)
        region = REGION.match(path)
        if region and method == "GET":
            quotas = self.region_quotas.get(region["region"], [])
            return 200, {"name": region["region"], "status": "UP", "quotas": quotas}
        if SERVICES.match(path) and method == "GET":
            names = sorted(self.enabled_services)
            return 200, {"services": [{"name": f"projects/1234/services/{n}", "state": "ENABLED"} for n in names]}
        if path.startswith("/compute/v1/"):
            return self._compute(method, path, query, body, injection)
        if path.startswith("/sm/v1/"):
            return self._secrets(method, path, query, body, authorization)
        if path.startswith("/v1/services/servicenetworking.googleapis.com/connections"):
            return self._connections(method, path, query, body)
        if path.startswith("/v1/operations/"):  # Service Networking's long-running operations
            op = self.operations.get(path.removeprefix("/v1/"))
            if not op:
                return 404, http_error(404, "operation not found")
            op["done"] = True  # done the second time it is read
            return 200, op
        if path.startswith("/storage/v1/b"):
            return self._buckets(method, path, query, body)
        if SERVICE_ACCOUNTS.match(path):
            return self._service_accounts(method, SERVICE_ACCOUNTS.match(path), body)
        if PROJECT_POLICY.match(path) and method == "POST":
            return self._project_policy(PROJECT_POLICY.match(path), body)
        if path.startswith("/v3/projects/") and method == "GET":  # Resource Manager: the project's number
            project = path.removeprefix("/v3/projects/")
            return 200, {"name": f"projects/{project_number(project)}", "projectId": project, "state": "ACTIVE"}
        match = LOCATIONS.match(path)
        if match:
            return self._locations(method, path, match, query, body)
        return 404, http_error(404, f"unknown path {path}")

    def _kind(self, method, path):
        """A request's kind for the call counts, e.g. 'POST bulkInsert' or 'GET file:instances'."""
        parts = [p for p in path.split("/") if p]
        nouns = [p for p in parts if p in NOUNS]
        noun = nouns[-1] if nouns else (parts[-1] if parts else "")
        if parts and parts[0] in ("file", "lustre", "sm"):
            noun = f"{parts[0]}:{noun}"
        return f"{method} {noun}"

    STEPS = ("PENDING", "RUNNING", "DONE")

    def _advance(self, op, to_the_end=False):
        """The operation one step further (GET), or DONE (`wait`); its error shows once it is DONE."""
        step = len(self.STEPS) - 1 if to_the_end else min(self.STEPS.index(op["status"]) + 1, len(self.STEPS) - 1)
        op["status"] = self.STEPS[step]
        op["progress"] = 100 if op["status"] == "DONE" else 50 * step
        shown = dict(op)
        error = shown.pop("pendingError", None)
        if op["status"] == "DONE" and error:
            shown.update(error)
        return shown

    def _operation(self, scope_url, target, op_type, error=None, status_code=None):
        self.counter += 1
        name = f"operation-{self.counter}"
        first = self.STEPS[max(0, len(self.STEPS) - 1 - self.operation_steps)]
        op = {
            "kind": "compute#operation",
            "id": str(self.counter),
            "name": name,
            "operationType": op_type,
            "status": first,
            "progress": 100 if first == "DONE" else 0,
            "targetLink": target,
            "selfLink": f"{scope_url}/operations/{name}",
        }
        if "/zones/" in scope_url:
            op["zone"] = scope_url
        elif "/regions/" in scope_url:
            op["region"] = scope_url
        if error:
            op["pendingError"] = {"error": {"errors": [error]}, "httpErrorStatusCode": status_code or 400}
        self.operations[f"{scope_url}/operations/{name}"] = op
        return (
            self._advance(op, to_the_end=True)
            if first == "DONE"
            else {k: v for k, v in op.items() if k != "pendingError"}
        )

    def _compute(self, method, path, query, body, injection):
        status, payload = self._compute_resource(method, path, query, body, injection)
        match = COMPUTE.match(path)
        changed = method != "GET" and status < 300
        if changed and match["rest"].startswith("networks"):
            self._peering_states()  # a peering added or removed, or a deleted network's peers' (INACTIVE)
        if changed and self.vpc is not None and match["rest"].startswith(("firewalls", "networks")):
            self._refresh_firewalls()  # what the console reaches: the rules, and the routes (peerings)
        return status, payload

    def _disk_architecture(self, source_disk):
        """A disk's architecture (ARM64 or X86_64): its instance's boot image's (disks are named after their VM)."""
        instance = self.resources.get("/compute/v1/" + source_disk.replace("/disks/", "/instances/")) or {}
        boot = ((instance.get("disks") or [{}])[0].get("initializeParams") or {}).get("sourceImage") or ""
        return fake_rules.image_architecture(self.resources, boot)

    def _compute_resource(self, method, path, query, body, injection):
        match = COMPUTE.match(path)
        if not match:
            return 404, http_error(404, "not found")
        scope_path = f"/compute/v1/projects/{match['project']}/{match['scope']}"
        scope_url = self.endpoint + scope_path
        rest = match["rest"].split("/")
        if rest[0] == "operations":
            op = self.operations.get(f"{scope_url}/operations/{rest[1]}")
            if not op:
                return 404, http_error(404, f"operation {rest[1]} not found")
            return 200, self._advance(op, to_the_end=rest[2:] == ["wait"])
        collection = rest[0]
        collection_path = f"{scope_path}/{collection}"
        error = {"code": injection.code, "message": injection.message} if injection else None
        refused = self._refused(method, match, rest, body)
        if refused:
            return refused
        if collection == "instances" and len(rest) == 2 and rest[1] == "bulkInsert" and method == "POST":
            return self._bulk_insert(scope_path, scope_url, body, error)
        if collection == "networks" and len(rest) == 3 and rest[2] in ("addPeering", "removePeering"):
            key = f"{collection_path}/{rest[1]}"
            if key not in self.resources:
                return 404, http_error(404, f"The resource '{key}' was not found", "notFound")
            peerings = self.resources[key].setdefault("peerings", [])
            if rest[2] == "addPeering":
                peering = body.get("networkPeering") or {}
                peer = "/compute/v1/" + peering.get("network", "").split("/compute/v1/")[-1].lstrip("/")
                if peer not in self.resources:
                    return 400, http_error(400, f"The resource '{peering.get('network')}' was not found", "invalid")
                peerings.append({**peering, "state": "INACTIVE"})
            else:
                self.resources[key]["peerings"] = [p for p in peerings if p.get("name") != body.get("name")]
            return 200, self._operation(scope_url, self.endpoint + key, rest[2])
        if collection == "instances" and len(rest) == 3 and rest[2] in ("reset", "start", "stop") and method == "POST":
            key = f"{collection_path}/{rest[1]}"
            if key not in self.resources:
                return 404, http_error(404, f"The resource '{key}' was not found", "notFound")
            if rest[2] == "reset" and self.resources[key]["status"] != "RUNNING":
                return 400, http_error(400, f"Instance '{rest[1]}' is not running", "resourceNotReady")
            self.resources[key][f"{rest[2]}s"] = self.resources[key].get(f"{rest[2]}s", 0) + 1
            self.resources[key]["status"] = "TERMINATED" if rest[2] == "stop" else "RUNNING"
            self._vm_change("halt", rest[1])
            if rest[2] != "stop":
                self._boot(key)
            return 200, self._operation(scope_url, self.endpoint + key, rest[2], error)
        if collection == "instances" and len(rest) == 3 and rest[2] == "serialPort" and method == "GET":
            key = f"{collection_path}/{rest[1]}"
            if key not in self.resources:
                return 404, http_error(404, f"The resource '{key}' was not found", "notFound")
            # What the guest printed; without a VM, by default, a startup script that ran to its end.
            printed = self.vpc.serial(rest[1]) if self.vpc is not None else None
            contents = self.resources[key].get("serialOutput", printed if printed is not None else SERIAL_DONE)
            return 200, {"contents": contents, "start": "0", "next": str(len(contents))}
        if collection == "instances" and len(rest) == 3 and rest[2] == "setMetadata" and method == "POST":
            key = f"{collection_path}/{rest[1]}"
            if key not in self.resources:
                return 404, http_error(404, f"The resource '{key}' was not found", "notFound")
            current = self.resources[key].get("metadata") or {}
            if body.get("fingerprint") != current.get("fingerprint", ""):
                return 412, http_error(
                    412, "Supplied fingerprint does not match current metadata fingerprint.", "conditionNotMet"
                )
            self.counter += 1
            self.resources[key]["metadata"] = {**body, "fingerprint": f"fp{self.counter}"}
            self.changed.notify_all()
            return 200, self._operation(scope_url, self.endpoint + key, "setMetadata")
        if len(rest) == 1 and method == "POST":
            name = body.get("name", "")
            key = f"{collection_path}/{name}"
            if key in self.resources:
                return 409, http_error(409, f"The resource '{key}' already exists", "alreadyExists")
            if collection == "instances" and not error:
                error = self._capacity_error(match["scope"], body, 1)
            if error:
                return 200, self._operation(scope_url, self.endpoint + key, "insert", error)
            self.resources[key] = {
                **copy.deepcopy(body),
                "selfLink": self.endpoint + key,
                "status": "RUNNING",
                "kind": f"compute#{collection}",
            }
            if collection == "instances":
                self._address(key)
                self._boot(key)
            if collection == "images" and "architecture" not in body:
                # An image made from a disk has the disk's architecture, which came from its source image.
                self.resources[key]["architecture"] = self._disk_architecture(body.get("sourceDisk") or "")
            return 200, self._operation(scope_url, self.endpoint + key, "insert")
        if len(rest) == 1 and method == "GET":
            items = [r for k, r in self.resources.items() if k.rsplit("/", 1)[0] == collection_path]
            items = filter_items(items, query.get("filter", [""])[0])
            return 200, page(items, query)
        key = f"{collection_path}/{rest[1]}"
        if method == "GET":
            return (
                (200, self.resources[key])
                if key in self.resources
                else (404, http_error(404, f"The resource '{key}' was not found", "notFound"))
            )
        if method == "DELETE":
            if key not in self.resources:
                return 404, http_error(404, f"The resource '{key}' was not found", "notFound")
            del self.resources[key]
            if collection == "instances":
                self._vm_change("destroy", rest[1])
            return 200, self._operation(scope_url, self.endpoint + key, "delete")
        return 405, http_error(405, "method not allowed")

    def _capacity_error(self, scope, properties, count):
        """A stockout set with `stockouts` ({(zone, machine type)}) or a regional quota of `quotas`
        ({(region, metric): limit}) that `count` more VMs would exceed, as the operation's error (bulkInsert
        checks quota and capacity up front: https://cloud.google.com/compute/docs/instances/multiple/about-bulk-creation)."""
        from clusters.spec.catalog import machine_type_info

        zone = scope.removeprefix("zones/")
        machine = (properties.get("machineType") or "").rsplit("/", 1)[-1]
        if (zone, machine) in self.stockouts:
            why = f"The zone '{zone}' does not have enough resources available to fulfill the request."
            return {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": why}
        region = zone.rsplit("-", 1)[0]
        info = machine_type_info(machine)
        if info is None:
            return None
        metric, each = quota_metric(info), info.accelerator_count or info.vcpus
        limit = self.quotas.get((region, metric))
        if limit is None:
            return None
        used = 0
        for key, instance in self.instances().items():
            found = machine_type_info((instance.get("machineType") or "").rsplit("/", 1)[-1])
            if f"/zones/{region}-" in key and found and quota_metric(found) == metric:
                used += found.accelerator_count or found.vcpus
        if used + each * count > limit:
            return {
                "code": "QUOTA_EXCEEDED",
                "message": f"Quota '{metric}' exceeded.  Limit: {float(limit)} in region {region}.",
            }
        return None

    def _refused(self, method, match, rest, body):
        """What the real API would refuse in this request (tests/fake_rules.py), as an HTTP error."""
        zone = match["scope"].removeprefix("zones/") if match["scope"].startswith("zones/") else ""
        request = fake_rules.Request(verb="", collection=rest[0], body=body, project=match["project"], zone=zone,
                                     resources=self.resources, account_seen=self.service_account_seen)  # fmt: skip
        if method == "POST" and len(rest) == 1:
            request.verb = "insert"
            if rest[0] == "instances":
                request.properties = body
            elif rest[0] == "instanceTemplates":
                request.properties, request.at = body.get("properties") or {}, "resource.properties"
        elif method == "POST" and rest[1:] == ["bulkInsert"]:
            request.verb = "bulkInsert"
            request.properties, request.at = body.get("instanceProperties") or {}, "resource.instanceProperties"
        elif method == "POST" and len(rest) == 3 and rest[2] == "setMetadata":
            request.verb = "setMetadata"
        elif method == "DELETE" and len(rest) == 2:
            request.verb, request.name = "delete", rest[1]
        else:
            return None
        return fake_rules.refusal_for(request)

    def _bulk_insert(self, scope_path, scope_url, body, error):
        names = list((body.get("perInstanceProperties") or {}).keys())
        template = body.get("sourceInstanceTemplate", "")
        properties = body.get("instanceProperties") or {}
        if template:
            template_key = "/compute/v1/" + template.split("/compute/v1/", 1)[-1].lstrip("/")
            properties = (self.resources.get(template_key) or {}).get("properties", properties)
        created = 0
        limit = None
        if not error:
            error = self._capacity_error(scope_path.split("/", 5)[-1], properties, len(names))
        if error and error.get("code") == "PARTIAL":
            limit = int(error["message"])  # create only this many, then fail the rest as exhausted
            error = {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": "The zone does not have enough resources available to fulfill the request.",
            }
        elif error:
            return 200, self._operation(scope_url, scope_url + "/instances", "bulkInsert", error)
        for name in names:
            if limit is not None and created >= limit:
                break
            key = f"{scope_path}/instances/{name}"
            if key in self.resources:
                continue
            self.resources[key] = {
                **copy.deepcopy(properties),  # what an instance made from the template carries (metadata, NICs, ...)
                "name": name,
                "machineType": properties.get("machineType", ""),
                "labels": properties.get("labels", {}),
                "status": "RUNNING",
                "selfLink": self.endpoint + key,
                "kind": "compute#instance",
            }
            self._address(key)
            self._boot(key)
            created += 1
        return 200, self._operation(
            scope_url, scope_url + "/instances", "bulkInsert", error if limit is not None else None
        )

    def _address(self, key):
        """The instance's internal address on its first NIC (from the VPC's range when VMs boot)."""
        interfaces = self.resources[key].setdefault("networkInterfaces", [{}]) or [{}]
        self.resources[key]["networkInterfaces"] = interfaces
        if self.vpc is not None:
            address = self.vpc.address()
        else:
            self.counter += 1
            address = f"10.128.{self.counter // 250 % 250}.{self.counter % 250 + 2}"
        interfaces[0] = {**interfaces[0], "networkIP": address}
        self.addresses[address] = key
        # An ephemeral external address per access config (the API fills in natIP, type ONE_TO_ONE_NAT and
        # the PREMIUM tier: https://cloud.google.com/compute/docs/reference/rest/v1/instances): from the VPC's
        # range when VMs boot (the console reaches it on the bridge; the VM's NAT maps it to the internal one
        # as Google's 1:1 NAT does), else from a public-looking range.
        for config in interfaces[0].get("accessConfigs") or []:
            if self.vpc is not None:
                config["natIP"] = self.vpc.external_address()
            else:
                self.counter += 1
                config["natIP"] = f"34.118.{self.counter // 250 % 250}.{self.counter % 250 + 2}"
            config.setdefault("type", "ONE_TO_ONE_NAT")
            config.setdefault("networkTier", "PREMIUM")

    def _boot(self, key):
        if self.vpc is None:
            return
        instance = self.resources[key]
        script = metadata_items(instance).get("startup-script", "")
        address = instance["networkInterfaces"][0]["networkIP"]
        self._vm_change("boot", instance["name"], address, self.metadata_host, script, external_ip(instance))
        self._vm_change("firewall", instance["name"], *self._console_ports(instance))

    def _refresh_firewalls(self):
        """Every VM's admitted ports again, after a firewall rule came or went."""
        for key in self.instances():
            self._vm_change("firewall", key.rsplit("/", 1)[1], *self._console_ports(self.resources[key]))

    def _peering_states(self):
        """Each peering ACTIVE when the network it names has one back, else INACTIVE: "the peering becomes
        ACTIVE after the network administrator of the other network creates a matching peering configuration",
        and a peering whose peer network was deleted (or removed its side) goes INACTIVE
        (https://cloud.google.com/vpc/docs/using-vpc-peering#creating_a_peering_configuration)."""
        for key, network in self.resources.items():
            for peering in network.get("peerings") or []:
                peer = self.resources.get("/compute/v1/" + network_id(peering.get("network", "")), {})
                back = [network_id(p.get("network", "")) for p in peer.get("peerings") or []]
                peering["state"] = "ACTIVE" if key.removeprefix("/compute/v1/") in back else "INACTIVE"

    def _routed(self, network):
        """Has the console (the gateway, in its own network) a route to `network`: the same network, or an
        ACTIVE peering with it (subnet routes are exchanged both ways)? Without a console network (a fake
        that does not model where the console is) every network is routed."""
        if self.console_network is None or network == self.console_network:
            return True
        peerings = self.resources.get(f"/compute/v1/{network}", {}).get("peerings") or []
        return any(network_id(p.get("network", "")) == self.console_network and p.get("state") == "ACTIVE"
                   for p in peerings)  # fmt: skip

    def _console_ports(self, instance):
        """(ports, external): the TCP port ranges of `instance` that the console (the VPC's gateway) may
        connect to, and the one address it may connect to them at (None: any of the instance's). Those the
        ingress allow rules of its network admit from a source range holding the gateway's address, for
        its tags (a rule without target tags applies to every instance of the network); with no route to
        its network (_routed: peering) only at its external address, if it has one, else none. Deny rules
        and priorities are not modelled: the console makes allow rules only."""
        network = network_id(instance["networkInterfaces"][0].get("network", ""))
        external = None
        if not self._routed(network):
            external = external_ip(instance)
            if external is None:
                return [], None
        tags = set((instance.get("tags") or {}).get("items", []))
        gateway = ipaddress.ip_address(self.vpc.gateway)
        ports = []
        for key, rule in self.resources.items():
            if "/global/firewalls/" not in key or network_id(rule.get("network", "")) != network:
                continue
            if rule.get("direction", "INGRESS") != "INGRESS" or rule.get("disabled"):
                continue
            if not any(gateway in ipaddress.ip_network(r, strict=False) for r in rule.get("sourceRanges", [])):
                continue
            if rule.get("targetTags") and not tags & set(rule["targetTags"]):
                continue
            for allowed in rule.get("allowed", []):
                if allowed.get("IPProtocol") not in ("tcp", "all", "6"):
                    continue
                for port in allowed.get("ports") or ["1-65535"]:
                    low, _, high = port.partition("-")
                    ports.append((int(low), int(high or low)))
        return sorted(ports), external

    def metadata(self, path, query, client, flavor):
        """The metadata server, as the VM at address `client` sees it: (status, text, etag)."""
        if flavor != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", ""
        with self.lock:
            key = self.addresses.get(client)
            if key not in self.resources:
                return 404, "no instance at this address", ""
            want = path.removeprefix("/computeMetadata/v1/")
            name = key.rsplit("/", 1)[1]
            if self.metadata_outages.get(name) and want != "instance/attributes/startup-script":
                self.metadata_outages[name] -= 1
                return 503, "Service Unavailable", ""
            answer = self._metadata_value(self.resources[key], key, want)
            if answer is None:
                return 404, "Not Found", ""
            if query.get("wait_for_change", [""])[0] == "true" and want.startswith("instance/attributes/"):
                # Answer when the value's ETag differs from the caller's, or at the timeout.
                last = query.get("last_etag", ["NONE"])[0]
                deadline = time.monotonic() + float(query.get("timeout_sec", ["60"])[0])
                while etag_of(answer) == last and key in self.resources and time.monotonic() < deadline:
                    self.changed.wait(timeout=max(0.0, deadline - time.monotonic()))
                    answer = self._metadata_value(self.resources.get(key, {}), key, want) or ""
            return 200, answer, etag_of(answer)

    def _metadata_value(self, instance, key, want):
        items = metadata_items(instance)
        project = key.split("/projects/", 1)[1].split("/", 1)[0]
        zone = key.split("/zones/", 1)[1].split("/", 1)[0]
        fixed = {
            "instance/name": instance.get("name"),
            "instance/hostname": f"{instance.get('name')}.{zone}.c.{project}.internal",
            "instance/zone": f"projects/1234/zones/{zone}",
            "instance/network-interfaces/0/ip": (instance.get("networkInterfaces") or [{}])[0].get("networkIP"),
            "project/project-id": project,
        }
        if want in fixed:
            return fixed[want]
        if want.startswith("instance/attributes/"):
            return items.get(want.removeprefix("instance/attributes/"))
        if want == "instance/service-accounts/default/token":
            if not instance.get("serviceAccounts"):
                return None  # a VM without a service account gets no token
            return json.dumps({"access_token": f"fake-token-{instance['name']}", "expires_in": 3599,
                               "token_type": "Bearer"})  # fmt: skip
        return None

    def _buckets(self, method, path, query, body):
        """Cloud Storage buckets (JSON API): names are global, so a name another project holds answers 409 on
        create and 403 on read (seed one with `"foreign": True`)."""
        parts = path.removeprefix("/storage/v1/b").strip("/").split("/")
        if parts == [""] and method == "POST":
            key = f"gcs:{body.get('name', '')}"
            if key in self.resources:
                why = "The requested bucket name is not available. The bucket namespace is shared by all users."
                return 409, http_error(409, why, "conflict")
            self.resources[key] = {**body, "projectNumber": project_number(query.get("project", [""])[0])}
            self.iam[key] = {"bindings": []}
            return 200, self.resources[key]
        key = f"gcs:{parts[0]}"
        bucket = self.resources.get(key)
        if bucket is None:
            return 404, http_error(404, "The specified bucket does not exist.", "notFound")
        if bucket.get("foreign"):
            return 403, http_error(403, "does not have storage.buckets.get access to the Google Cloud Storage bucket.",
                                   "forbidden")  # fmt: skip
        if parts[1:] == ["iam"]:
            if method == "PUT":
                unseen = self.unseen_member(body)
                if unseen:
                    return 400, http_error(400, f"Service account {unseen} does not exist.", "badRequest")
                self.iam[key] = {"bindings": body.get("bindings", [])}
            return 200, {"kind": "storage#policy", **self.iam.setdefault(key, {"bindings": []})}
        return 200, bucket

    def add_service_account(self, email):
        """A service account that exists already (made by the user, not the console)."""
        with self.lock:
            self.resources[f"iam:{email}"] = {"email": email, "description": "", "visibleAt": 0}

    def service_account_seen(self, email):
        found = self.resources.get(f"iam:{email}")
        return found is not None and time.monotonic() >= found["visibleAt"]

    def unseen_member(self, policy):
        """The first service account a policy names that IAM does not know (or not yet), else ''."""
        for binding in (policy or {}).get("bindings", []):
            for member in binding.get("members", []):
                email = member.removeprefix("serviceAccount:")
                project_account = email != member and email.endswith(".iam.gserviceaccount.com")
                if project_account and not self.service_account_seen(email):
                    return email
        return ""

    def _service_accounts(self, method, match, body):
        """IAM's service accounts (create, get, delete); a new one is read back at once, but policies and
        VMs that name it are refused for iam_propagation_seconds."""
        project = match["project"]
        if match["email"] is None and method == "POST":
            account_id = body.get("accountId", "")
            if not (6 <= len(account_id) <= 30 and ACCOUNT_ID.match(account_id)):
                why = f"Invalid accountId '{account_id}': 6-30 characters matching [a-z]([-a-z0-9]*[a-z0-9])."
                return 400, rpc_error(400, why, "INVALID_ARGUMENT")
            email = f"{account_id}@{project}.iam.gserviceaccount.com"
            if f"iam:{email}" in self.resources:
                return 409, rpc_error(409, f"Service account {account_id} already exists within project "
                                           f"projects/{project}.", "ALREADY_EXISTS")  # fmt: skip
            account = {**(body.get("serviceAccount") or {}), "email": email, "projectId": project,
                       "name": f"projects/{project}/serviceAccounts/{email}",
                       "visibleAt": time.monotonic() + self.iam_propagation_seconds}  # fmt: skip
            self.resources[f"iam:{email}"] = account
            return 200, {k: v for k, v in account.items() if k != "visibleAt"}
        email = match["email"] or ""
        if f"iam:{email}" not in self.resources:  # read back at once; its uses wait for propagation
            return 404, rpc_error(404, f"Unknown service account projects/{project}/serviceAccounts/{email}",
                                  "NOT_FOUND")  # fmt: skip
        if method == "GET":
            return 200, {k: v for k, v in self.resources[f"iam:{email}"].items() if k != "visibleAt"}
        if method == "DELETE":
            del self.resources[f"iam:{email}"]
            return 200, {}
        return 405, http_error(405, "method not allowed")

    def _project_policy(self, match, body):
        """Resource Manager's project IAM policy: setIamPolicy with a stale etag is refused (409 ABORTED),
        https://cloud.google.com/iam/docs/policies#etag."""
        key = f"project:{match['project']}"
        policy = self.iam.setdefault(key, {"bindings": [], "etag": "BwAAAA==", "version": 1})
        if match["verb"] == "getIamPolicy":
            return 200, copy.deepcopy(policy)
        wanted = body.get("policy") or {}
        if wanted.get("etag") and wanted["etag"] != policy["etag"]:
            why = "There were concurrent policy changes. Please retry the whole read-modify-write with exponential "
            why += "backoff."
            return 409, rpc_error(409, why, "ABORTED")
        unseen = self.unseen_member(wanted)
        if unseen:
            return 400, rpc_error(400, f"Service account {unseen} does not exist.", "INVALID_ARGUMENT")
        self.counter += 1
        self.iam[key] = {**wanted, "etag": f"BwA{self.counter:05d}=", "version": 1}
        return 200, copy.deepcopy(self.iam[key])

    def _vm_member(self, instance, project):
        """The IAM member a VM's token stands for: its service account ("default": the project's Compute
        Engine default account, PROJECT_NUMBER-compute@developer.gserviceaccount.com)."""
        found = next((r for k, r in self.instances().items() if k.endswith(f"/instances/{instance}")), {})
        email = ((found.get("serviceAccounts") or [{}])[0]).get("email", "")
        if email == "default":
            email = f"{project_number(project)}-compute@developer.gserviceaccount.com"
        return f"serviceAccount:{email}"

    def _locations(self, method, path, match, query, body):
        rest = match["rest"].split("/")
        service = match["service"]
        base = f"projects/{match['project']}/locations/{match['location']}"
        key = f"{service}:{base}"
        if rest[0] == "operations":
            op = self.operations.get(f"{base}/operations/{rest[1]}")
            return (200, op) if op else (404, http_error(404, "operation not found"))
        if rest[0] != "instances":
            return 404, http_error(404, "not found")
        if len(rest) == 1 and method == "POST":
            name = f"{base}/instances/{query['instanceId'][0]}"
            if f"{service}:{name}" in self.resources:
                return 409, http_error(409, f"Resource '{name}' already exists", "ALREADY_EXISTS")
            wrong = service == "file" and filestore_location_refused(body.get("tier", ""), match["location"])
            if wrong:
                return 400, rpc_error(400, wrong, "INVALID_ARGUMENT")
            resource = {**body, "name": name, "state": "READY", **self._server_fields(service)}
            self.resources[f"{service}:{name}"] = resource
            return 200, self._lro(base, {"@type": f"type.googleapis.com/{INSTANCE_TYPES[service]}", **resource})
        if len(rest) == 1 and method == "GET":
            return 200, {"instances": [r for k, r in self.resources.items() if k.startswith(f"{key}/instances/")]}
        name = f"{service}:{base}/instances/{rest[1]}"
        if method == "GET":
            found = self.resources.get(name)
            if found and found.get("state") == "DELETING":  # a delete takes a while: gone when read again
                del self.resources[name]
            return (200, found) if found else (404, http_error(404, f"{name} not found", "NOT_FOUND"))
        if method == "DELETE":
            if name not in self.resources:
                return 404, http_error(404, f"{name} not found", "NOT_FOUND")
            self.resources[name]["state"] = "DELETING"
            return 200, self._lro(base)
        return 405, http_error(405, "method not allowed")

    def _server_fields(self, service):
        """What the real services set on a new instance: Filestore's IP, Managed Lustre's mount point."""
        self.counter += 1
        address = f"10.90.{self.counter % 250}.2"
        if service == "file":
            return {"networks": [{"ipAddresses": [address], "network": "fake"}]}
        return {"mountPoint": f"{address}@tcp:/lustrefs"}

    def _lro(self, base, response=None):
        """A finished google.longrunning operation holding the resource (or Empty, for a delete)."""
        self.counter += 1
        name = f"{base}/operations/op-{self.counter}"
        op = {
            "name": name,
            "done": True,
            "response": response or {"@type": "type.googleapis.com/google.protobuf.Empty"},
        }
        self.operations[name] = op
        return op

    def _secrets(self, method, path, query, body, authorization=""):
        """Secret Manager. IAM is checked for the VMs (their metadata server's token names them): a VM
        reads a secret only when its service account has secretAccessor on it; the console's own
        requests (anonymous credentials) are the administrator's."""
        match = SECRETS.match(path)
        if not match:
            return 404, http_error(404, "not found")
        parent = f"projects/{match['project']}/secrets"
        if match["secret"] and match["verb"] in ("getIamPolicy", "setIamPolicy"):
            name = f"{parent}/{match['secret']}"
            if f"sm:{name}" not in self.resources:
                return 404, http_error(404, f"Secret [{name}] not found.", "NOT_FOUND")
            if match["verb"] == "setIamPolicy":
                unseen = self.unseen_member(body.get("policy"))
                if unseen:
                    return 400, rpc_error(400, f"Service account {unseen} does not exist.", "INVALID_ARGUMENT")
                self.iam[name] = body.get("policy") or {}
            return 200, {"version": 1, **self.iam.get(name, {})}
        if match["verb"] == "access" and authorization.startswith("Bearer fake-token-"):
            member = self._vm_member(authorization.removeprefix("Bearer fake-token-"), match["project"])
            name = f"{parent}/{match['secret']}"
            bindings = self.iam.get(name, {}).get("bindings", [])
            granted = {
                m for b in bindings if b.get("role") == "roles/secretmanager.secretAccessor" for m in b["members"]
            }
            if member not in granted:
                why = f"Permission 'secretmanager.versions.access' denied for resource '{name}/versions/latest'"
                return 403, rpc_error(403, f"{why} (or it may not exist).", "PERMISSION_DENIED")
        if not match["secret"]:
            name = f"{parent}/{query['secretId'][0]}"
            if f"sm:{name}" in self.resources:
                return 409, http_error(409, f"Secret [{name}] already exists.", "ALREADY_EXISTS")
            self.resources[f"sm:{name}"] = {**body, "name": name}
            self.secret_versions[name] = []
            return 200, self.resources[f"sm:{name}"]
        name = f"{parent}/{match['secret']}"
        if f"sm:{name}" not in self.resources:
            return 404, http_error(404, f"Secret [{name}] not found.", "NOT_FOUND")
        versions = self.secret_versions[name]  # payloads; None for a destroyed version (its data is gone)
        if match["verb"] == "addVersion":
            versions.append(body.get("payload", {}))
            return 200, {"name": f"{name}/versions/{len(versions)}", "state": "ENABLED"}
        if match["verb"] in ("access", "destroy"):
            number = len(versions) if match["version"] in (None, "latest") else int(match["version"])
            if not 1 <= number <= len(versions):
                return 404, http_error(404, f"Secret Version [{name}/versions/{number}] not found.", "NOT_FOUND")
            version = f"{name}/versions/{number}"
            if versions[number - 1] is None:
                why = f"Secret Version [{version}] is in DESTROYED state."
                return 400, rpc_error(400, why, "FAILED_PRECONDITION")
            if match["verb"] == "destroy":
                versions[number - 1] = None
                return 200, {"name": version, "state": "DESTROYED"}
            return 200, {"name": version, "payload": versions[number - 1]}
        if path.endswith("/versions") and method == "GET":
            states = ["DESTROYED" if v is None else "ENABLED" for v in versions]
            return 200, {"versions": [{"name": f"{name}/versions/{i + 1}", "state": state}
                                      for i, state in enumerate(states)]}  # fmt: skip
        if method == "GET":
            return 200, self.resources[f"sm:{name}"]
        if method == "DELETE":
            del self.resources[f"sm:{name}"]
            del self.secret_versions[name]
            return 200, {}
        return 405, http_error(405, "method not allowed")

    def _connections(self, method, path, query, body):
        """Service Networking's connections. The consumer network is `projects/{NUMBER}/global/networks/N`
        (https://cloud.google.com/service-infrastructure/docs/service-networking/reference/rest/v1/services.connections);
        a connection a producer (Filestore, Lustre) still uses is not deleted."""
        network = body.get("consumerNetwork") or body.get("network") or query.get("network", [""])[0]
        if not NUMBERED_NETWORK.match(network):
            why = "the project must be given by its number, as projects/{project_number}/global/networks/{network}"
            return 400, rpc_error(400, f"Invalid network '{network}': {why}.", "INVALID_ARGUMENT")
        key = "servicenetworking/" + network
        if path.endswith(":deleteConnection"):
            name = network.rsplit("/", 1)[-1]
            users = [
                k for k, r in self.resources.items() if k.startswith(("file:", "lustre:")) and uses_network(r, name)
            ]
            if users:
                why = "Producer services (e.g. CloudSQL, Cloud Memstore, etc.) are still using this connection."
                return 400, rpc_error(400, f"Failed to delete connection; {why}", "FAILED_PRECONDITION")
            self.resources.pop(key, None)
            return 200, self._networking_operation()
        if method == "POST":
            self.resources[key] = {**body, "service": "services/servicenetworking.googleapis.com"}
            return 200, self._networking_operation()
        found = [r for k, r in self.resources.items() if k == key]
        return 200, {"connections": found}

    def _networking_operation(self):
        """A Service Networking operation, not done when answered: done when read again."""
        self.counter += 1
        name = f"operations/pssn.p24-{self.counter}"
        self.operations[name] = {"name": name, "done": False}
        return dict(self.operations[name])


NUMBERED_NETWORK = re.compile(r"projects/\d+/global/networks/[a-z][-a-z0-9]*\Z")


def project_number(project):
    """A stable 12-digit number for a project id, as Resource Manager gives each project."""
    return str(100000000000 + int(hashlib.sha256(project.encode()).hexdigest()[:8], 16))


# Basic, zonal and high scale instances live in a zone; regional and enterprise ones in a region.
# https://cloud.google.com/filestore/docs/service-tiers
REGIONAL_FILESTORE_TIERS = ("REGIONAL", "ENTERPRISE")


def filestore_location_refused(tier, location):
    if isinstance(tier, int):  # the client sends enums as numbers ($alt=json;enum-encoding=int)
        from google.cloud import filestore_v1

        tier = filestore_v1.Instance.Tier(tier).name
    zonal = location.count("-") == 2  # us-central1-b; a region is us-central1
    if tier in REGIONAL_FILESTORE_TIERS and zonal:
        return f"{tier} instances are regional: the location must be a region, not zone {location}."
    if tier not in REGIONAL_FILESTORE_TIERS and not zonal:
        return f"{tier} instances are zonal: the location must be a zone, not region {location}."
    return ""


def quota_metric(info):
    """Compute Engine's regional quota metric a machine type counts against: its GPUs' (NVIDIA_H200_GPUS,
    NVIDIA_H100_MEGA_GPUS) or its family's vCPUs (N2_CPUS; CPUS for N1 and E2)."""
    if info.accelerator_type:
        model = [p for p in info.accelerator_type.removeprefix("NVIDIA_").split("_") if not p.endswith("GB")]
        return f"NVIDIA_{'_'.join(model)}_GPUS"
    family = info.name.split("-")[0]
    return "CPUS" if family in ("n1", "e2") else f"{family.upper()}_CPUS"


def uses_network(resource, name):
    networks = [n.get("network", "") for n in resource.get("networks") or []] + [resource.get("network", "")]
    return any(n and n.rsplit("/", 1)[-1] == name for n in networks)


def rpc_error(status, message, code):
    """The error shape of Google's newer APIs (google.rpc.Status): Service Networking, Filestore, Lustre."""
    return {"error": {"code": status, "message": message, "status": code}}


NOUNS = {
    "networks",
    "subnetworks",
    "firewalls",
    "routers",
    "addPeering",
    "removePeering",
    "instanceTemplates",
    "resourcePolicies",
    "instances",
    "bulkInsert",
    "addresses",
    "wait",
    "connections",
    "operations",
    "setMetadata",
    "reset",
    "start",
    "stop",
    "images",
    "secrets",
    "versions",
    "serviceAccounts",
}


def metadata_items(instance):
    return {item["key"]: item.get("value", "") for item in (instance.get("metadata") or {}).get("items", [])}


def etag_of(text):
    return hashlib.sha256((text or "").encode()).hexdigest()[:16]


def http_error(status, message, reason=""):
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason or "error"}],
        }
    }


def filter_items(items, expression):
    for match in FILTER.finditer(expression or ""):
        items = [i for i in items if (i.get("labels") or {}).get(match["key"]) == match["value"]]
    return items


def page(items, query):
    size = int(query.get("maxResults", ["500"])[0])
    start = int(query.get("pageToken", ["0"])[0] or 0)
    body = {"items": items[start : start + size]}
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)
    return body


def external_ip(instance):
    """The instance's external address (its first NIC's access config's natIP), or None."""
    configs = instance["networkInterfaces"][0].get("accessConfigs") or []
    return next((c["natIP"] for c in configs if c.get("natIP")), None)


def network_id(url):
    """projects/P/global/networks/N of a network's URL or partial path ("" when it names none)."""
    found = re.search(r"projects/[^/]+/global/networks/[^/]+", url or "")
    return found.group(0) if found else ""
