"""Issue an API token for a user and print it once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.models import APIToken


class Command(BaseCommand):
    help = "Create an API token for USER and print the secret (it is shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")

    def handle(self, username, name, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'")
        _token, raw = APIToken.issue(user, name)
        self.stdout.write(raw)
