"""The console's own code that a cluster's nodes run: the health agent and its checks, and the one
training entry point (recipes/node/) with its shipped data. It is copied into the cluster's shared
home through the cluster agent, once per version (`.tcc/runtime-<digest of the files>/`), so a scan or
a run starts the same code on a local cluster and on a gce VM, from the home every node mounts, with
the backend's Python for the nodes (`node_python`: the console's own on local, GCE_NODE_PYTHON on gce).
"""

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings

from .reach import with_backend

# What the nodes import (`python -m clusters.health.agent`, `recipes.node.train`, `recipes.node.serve`):
# standard library, numpy and torch only; nothing here may import Django (.importlinter checks recipes.node).
FILES = [
    "clusters/__init__.py",
    "clusters/rendezvous.py",
    "clusters/health/__init__.py",
    "clusters/health/agent.py",
    "clusters/health/epilog.py",
    "clusters/health/policy.py",
    "clusters/health/policy.json",
    "clusters/health/thresholds.json",
    "clusters/health/xids.json",
    "clusters/health/checks/*.py",
    "clusters/health/simulated/*.*",
    "recipes/__init__.py",
    "recipes/node/*.py",
    "recipes/node/data/*.jsonl",
]
DONE = ".installed"


@dataclass(frozen=True)
class NodeRuntime:
    python: str  # the interpreter on the nodes
    folder: str  # the runtime's folder as the nodes see it (cd here, then python -m ...)
    relative: str  # the same, relative to the shared home (for the console's file calls)


@cache
def bundle():
    """({relative path: bytes}, digest) of the files above, read once per process."""
    root = Path(settings.BASE_DIR)
    files = {str(path.relative_to(root)): path.read_bytes() for pattern in FILES for path in sorted(root.glob(pattern))}
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return files, digest.hexdigest()[:12]


def where(backend, cluster):
    """This version's runtime on the cluster, installed or not."""
    relative = f".tcc/runtime-{bundle()[1]}"
    home = str(backend.shared_dir(cluster))
    return NodeRuntime(python=backend.node_python(cluster), folder=f"{home}/{relative}", relative=relative)


def install(backend, cluster):
    """The runtime on the cluster, installed first if this version is not there yet (one stat when it
    is); BackendErrors as the backend raises them (for a step's context)."""
    runtime, (files, digest) = where(backend, cluster), bundle()
    agent = backend.agent(cluster)
    if not agent.stat(f"{runtime.relative}/{DONE}")["exists"]:
        for name, data in files.items():  # readable by every account: users' runs start this code
            agent.write(f"{runtime.relative}/{name}", data, mode=0o644)
        agent.write(
            f"{runtime.relative}/{DONE}", digest.encode(), mode=0o644
        )  # last: a half-copied one is copied again
    return runtime


def node_runtime(cluster, installed=True):
    """install() (or, with installed=False, where()) for recipes and pages: a failure is Unavailable
    (503) or Conflict."""
    return with_backend(cluster, lambda backend: (install if installed else where)(backend, cluster))
