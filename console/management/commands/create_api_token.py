"""Issue an API token for a user and print it once."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from clusters.models import Project
from console.models import APIToken


class Command(BaseCommand):
    help = "Create an API token for USER and print the secret (it is shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--project", help="only this project (its slug); default: every project of USER")
        parser.add_argument("--read-only", action="store_true", help="reads only, whatever USER's roles")
        parser.add_argument("--expires-days", type=int, help="days until the token stops working; default: never")

    def handle(self, username, name, project=None, read_only=False, expires_days=None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'")
        scope = None
        if project:
            scope = Project.objects.filter(slug=project, memberships__user=user).first()
            if scope is None:
                raise CommandError(f"'{username}' is not a member of a project '{project}'")
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be 1 or more")
        expires = timezone.now() + timedelta(days=expires_days) if expires_days else None
        _token, raw = APIToken.issue(user, name, project=scope, read_only=read_only, expires=expires)
        self.stdout.write(raw)
