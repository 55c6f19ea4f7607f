"""A project's members and their roles; a project always keeps at least one admin. A member who is
removed loses their account's place on the project's clusters too (a LEAVE operation per cluster)."""

from django.contrib.auth import get_user_model
from django.db import transaction

from console.errors import Conflict, FieldErrors

from .. import operations
from ..accounts import account_for
from ..choices import ClusterStatus, Role
from ..models import Cluster, Membership
from ..work import Step

LEAVE = "LEAVE"


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
        user = membership.user
        membership.delete()
        # The console no longer lets them in, but on the clusters their account still owns a place in the
        # project's group and what they left running or queued: each cluster takes both away.
        for cluster in Cluster.objects.filter(project=project, status__in=ClusterStatus.usable()):
            operations.start(cluster, LEAVE, params={"user_id": user.pk, "username": user.get_username()},
                             message=f"{user.get_username()} left project {project.slug}: their jobs here are "
                                     "cancelled and their account leaves the project's group")  # fmt: skip


def keep_an_admin(project, *, leaving):
    if leaving.role != Role.ADMIN:
        return
    others = Membership.objects.select_for_update().filter(project=project, role=Role.ADMIN).exclude(pk=leaving.pk)
    if not others.exists():
        raise Conflict(f"'{leaving.user.username}' is the last admin of project '{project.slug}'; make another first")


def revoke(ctx):
    """The LEAVE step: unless they are a member again by now, the account of the user who left gives up
    the project's group on this cluster and their jobs there are cancelled."""
    user = get_user_model().objects.filter(pk=ctx.params["user_id"]).first()
    if user is None or Membership.objects.filter(project=ctx.cluster.project, user=user).exists():
        return
    ctx.backend.remove_account(ctx.cluster, account_for(user, ctx.cluster.project))


operations.register(
    operations.Kind(
        name=LEAVE,
        label="Member removal",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.usable()),
        steps=lambda ctx: [Step(f"Cancel {ctx.params.get('username', 'their')}'s jobs and close the account", revoke)],
        response="empty",
        exclusive=False,
    )
)
