"""Bake the gce backend's node image: `manage.py gce_image build --project P --zone Z [--gpu]`."""

from django.core.management.base import BaseCommand, CommandError

from clusters import services
from clusters.models import Project
from console.errors import ConsoleError


class Command(BaseCommand):
    help = (
        "build: bake a node image (Slurm, munge, gcsfuse, the node runtime; for --gpu also DCGM on Ubuntu's "
        "accelerator image with the NVIDIA driver) into an image family of PROJECT's Google Cloud project, so "
        "nodes boot without the internet. Then set GCE_IMAGE (or GCE_GPU_IMAGE) to the family it prints."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["build"])
        parser.add_argument("--project", required=True, help="the console project's slug (its Google Cloud project)")
        parser.add_argument("--zone", required=True, help="where the builder VM runs, e.g. us-central1-b")
        parser.add_argument("--gpu", action="store_true", help="a GPU node image (Ubuntu accelerator base, DCGM)")
        parser.add_argument("--arm64", action="store_true", help="with --gpu: for A4X's Arm CPUs (GCE_GPU_ARM64_IMAGE)")
        parser.add_argument(
            "--family", default="", help="the image family (default tcc-node, tcc-gpu-node, tcc-gpu-node-arm64)"
        )
        parser.add_argument("--base", default="", help="the base image or family URL, instead of the default")

    def handle(self, action, project, zone, gpu, arm64, family, base, **options):
        found = Project.objects.filter(slug=project).first()
        if found is None:
            raise CommandError(f"No project '{project}'")
        try:
            baked = services.bake_node_image(
                project=found, zone=zone, gpu=gpu, arm64=arm64, family=family, base=base, report=self.stdout.write
            )
        except ConsoleError as exc:
            raise CommandError(exc.message) from None
        setting = "GCE_GPU_ARM64_IMAGE" if arm64 else "GCE_GPU_IMAGE" if gpu else "GCE_IMAGE"
        self.stdout.write(f"Made image {baked.image}. Nodes boot it with {setting}={baked.family_url}")
