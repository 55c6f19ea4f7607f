"""Inject a fault into a local cluster's node, to rehearse health scans and repairs (local backend only)."""

from django.core.management.base import BaseCommand, CommandError

from clusters.health.faults import KINDS, FaultError, inject
from clusters.models import Cluster


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
        try:
            self.stdout.write(inject(found, node, kind, value))
        except FaultError as exc:
            raise CommandError(str(exc)) from exc
