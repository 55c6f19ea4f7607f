"""Rotate a cluster's controller certificate and CA now (after a suspected leak of the controller's key, say);
the daily task does it on its own before a certificate ends (clusters/services/certificates.py)."""

from django.core.management.base import BaseCommand, CommandError

from clusters.models import Cluster
from clusters.services import certificates
from console.errors import ConsoleError


class Command(BaseCommand):
    help = "Start a rotation of PROJECT/CLUSTER's controller certificate and CA (a worker runs it)"

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="project/cluster")
        parser.add_argument("--reason", default="asked for with manage.py rotate_tls")

    def handle(self, cluster, reason, **options):
        project, _, name = cluster.partition("/")
        found = Cluster.objects.live().filter(project__slug=project, name=name).first()
        if found is None:
            raise CommandError(f"No cluster {cluster}")
        try:
            operation = certificates.start_rotation(found, reason)
        except ConsoleError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Started operation {operation.uuid}: the rotation of {cluster}'s certificate")
