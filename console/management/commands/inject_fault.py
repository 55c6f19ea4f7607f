"""Inject a fault into a local cluster's node, to rehearse health scans and repairs (local backend only)."""

import json

from django.core.management.base import BaseCommand, CommandError

from clusters.health.scans import faults_dir
from clusters.models import Cluster

KINDS = {
    "perturb": "the correctness check computes a slightly wrong result",
    "slow": "the speed check is throttled (VALUE: 0-10, default 5)",
    "disk_full": "the disk check sees no free space",
    "kill_node": "the node dies: its slurmd and job steps are killed at once (Slurm marks it down)",
    "clear": "remove every fault of the node",
}


class Command(BaseCommand):
    help = "Inject a fault into NODE of PROJECT/CLUSTER: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items())

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="project/cluster")
        parser.add_argument("node")
        parser.add_argument("kind", choices=sorted(KINDS))
        parser.add_argument("--value", type=float, default=5)

    def handle(self, cluster, node, kind, value, **options):
        project, _, name = cluster.partition("/")
        found = Cluster.objects.live().filter(project__slug=project, name=name).first()
        if found is None:
            raise CommandError(f"No cluster {cluster}")
        if found.backend != "local":
            raise CommandError("Fault injection is for the local backend only")
        if not found.nodes.filter(name=node).exists():
            raise CommandError(f"{cluster} has no node {node}")
        if kind == "kill_node":
            from clusters.backends import get_backend

            get_backend("local").kill_node(found, node)
            self.stdout.write(f"{node}: slurmd and its job steps killed")
            return
        folder = faults_dir(found)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{node}.json"
        faults = json.loads(path.read_text()) if path.exists() else {}
        if kind == "clear":
            faults = {}
        else:
            faults[kind] = value if kind == "slow" else True
        path.write_text(json.dumps(faults))
        self.stdout.write(f"{node}: {faults or 'no faults'}")
