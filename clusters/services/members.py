"""A project's members and their roles; a project always keeps at least one admin."""

from django.contrib.auth import get_user_model
from django.db import transaction

from console.errors import Conflict, FieldErrors

from ..choices import Role
from ..models import Membership


def set_role(project, username, role):
    """Add `username` to the project with `role`, or change their role; returns the Membership."""
    errors = {}
    user = get_user_model().objects.filter(username=username, is_active=True).first() if username else None
    if user is None:
        errors["username"] = ["no active user has this name"]
    if role not in Role.values:
        errors["role"] = [f"must be one of: {', '.join(Role.values)}"]
    if errors:
        raise FieldErrors(errors)
    with transaction.atomic():
        membership, _created = Membership.objects.select_for_update().get_or_create(
            project=project, user=user, defaults={"role": role}
        )
        if membership.role != role:
            keep_an_admin(project, leaving=membership)
            membership.role = role
            membership.save(update_fields=["role"])
    return membership


def remove(project, username):
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(project=project, user__username=username).first()
        if membership is None:
            raise FieldErrors({"username": [f"'{username}' is not a member of project '{project.slug}'"]})
        keep_an_admin(project, leaving=membership)
        membership.delete()


def keep_an_admin(project, *, leaving):
    if leaving.role != Role.ADMIN:
        return
    others = Membership.objects.select_for_update().filter(project=project, role=Role.ADMIN).exclude(pk=leaving.pk)
    if not others.exists():
        raise Conflict(f"'{leaving.user.username}' is the last admin of project '{project.slug}'; make another first")
