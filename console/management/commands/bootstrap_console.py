"""Create a first admin user and project for a fresh console (idempotent)."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from clusters.choices import Role
from clusters.models import Project


class Command(BaseCommand):
    help = "Ensure an admin user (CONSOLE_ADMIN_USER / CONSOLE_ADMIN_PASSWORD) and a 'default' project exist."

    def handle(self, **options):
        username = os.environ.get("CONSOLE_ADMIN_USER", "admin")
        password = os.environ.get("CONSOLE_ADMIN_PASSWORD")
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            if not password:
                self.stdout.write("Set CONSOLE_ADMIN_PASSWORD to create the first admin user.")
                return
            user = User.objects.create_superuser(username, f"{username}@localhost", password)
            self.stdout.write(f"Created admin user '{username}'.")
        project, created = Project.objects.get_or_create(slug="default", defaults={"name": "Default project"})
        project.members.add(user, through_defaults={"role": Role.ADMIN})
        if created:
            self.stdout.write(f"Created project 'default' with member '{username}'.")
