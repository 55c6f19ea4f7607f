"""Project members get roles: a Membership row per (project, user). Members of older databases keep
everything they could do before, so they become admins."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def copy_members(apps, schema_editor):
    Project = apps.get_model("clusters", "Project")
    Membership = apps.get_model("clusters", "Membership")
    rows = Project.members.through.objects.all()
    Membership.objects.bulk_create(
        [Membership(project_id=row.project_id, user_id=row.user_id, role="admin") for row in rows]
    )


def copy_back(apps, schema_editor):
    pass  # the reverse migration re-creates the plain table empty; roles have no older shape


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0010_project_node_quota_counts_login"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Membership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "role",
                    models.CharField(
                        choices=[("viewer", "Viewer"), ("operator", "Operator"), ("admin", "Admin")],
                        default="viewer",
                        max_length=16,
                    ),
                ),
                ("created", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="clusters.project"
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memberships",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["project", "user__username"]},
        ),
        migrations.AddConstraint(
            model_name="membership",
            constraint=models.UniqueConstraint(fields=("project", "user"), name="one_membership_per_user"),
        ),
        migrations.RunPython(copy_members, copy_back),
        migrations.RemoveField(model_name="project", name="members"),
        migrations.AddField(
            model_name="project",
            name="members",
            field=models.ManyToManyField(
                blank=True, related_name="projects", through="clusters.Membership", to=settings.AUTH_USER_MODEL
            ),
        ),
    ]
