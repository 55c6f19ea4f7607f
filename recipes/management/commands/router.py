"""Run the inference router (recipes/serving/router.py) on ROUTER_HOST:ROUTER_PORT."""

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve every endpoint's replicas behind the console's token check (recipes/serving/router.py)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.ROUTER_HOST)
        parser.add_argument("--port", type=int, default=settings.ROUTER_PORT)

    def handle(self, *args, host, port, **options):
        from recipes.serving.router import serve  # aiohttp is loaded only by the command that serves

        self.stdout.write(f"Router on http://{host}:{port}/<project>/<endpoint>/v1/...", ending="\n")
        self.stdout.flush()
        serve(host, port)
