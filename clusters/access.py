"""What a user may see and do: their projects, the clusters and runs in them, and what their role in
each project allows. Every page, both APIs, the compatible paths and the proxies ask here, so the
rule is written once.

Permissions are the managed service's (`modelDevelopmentClusters.get`, `.list`, `.create`, `.update`,
`.delete`, `.run`) plus `projects.members`; a role grants a set of them:

    viewer    get, list                      read every page and GET of the project
    operator  + run                          runs, scans, job cancels, :callSlurmRestApi
    admin     + create, update, delete,      create, resize, delete clusters; health schedules;
              members                        the project's members

An API token narrows its user's access further: to one project (`token.project`) and to reads
(`token.read_only` caps the role at viewer); an expired one does not authenticate at all.

A lookup that finds nothing, or finds something outside the user's projects, raises Http404 (pages
answer 404, DRF a JSON 404, v1beta1 maps it to its own NOT_FOUND / PERMISSION_DENIED): an outsider
cannot tell a project or cluster exists. A member whose role lacks the permission gets
PermissionDenied (403, and PERMISSION_DENIED on v1beta1) naming the role it needs.
"""

from django.http import Http404

from console.errors import PermissionDenied
from console.models import APIToken

from .choices import ClusterStatus, Role
from .models import Cluster, Membership, Project

GET = "modelDevelopmentClusters.get"
LIST = "modelDevelopmentClusters.list"
CREATE = "modelDevelopmentClusters.create"
UPDATE = "modelDevelopmentClusters.update"
DELETE = "modelDevelopmentClusters.delete"
RUN = "modelDevelopmentClusters.run"
MEMBERS = "projects.members"

GRANTS = {
    Role.VIEWER: {GET, LIST},
    Role.OPERATOR: {GET, LIST, RUN},
    Role.ADMIN: {GET, LIST, RUN, CREATE, UPDATE, DELETE, MEMBERS},
}


def needed_role(permission):
    return next(role for role in Role if permission in GRANTS[role])


def token_of(user):
    """The API token the request authenticated with (console.auth sets it), else None (a session)."""
    return getattr(user, "api_token", None)


def effective(role, user):
    """The role after the token's read-only cap."""
    token = token_of(user)
    if role is not None and token is not None and token.read_only:
        return Role.VIEWER
    return role


def memberships(user):
    if not user.is_authenticated:
        return Membership.objects.none()
    found = Membership.objects.filter(user=user)
    token = token_of(user)
    if token is not None and token.project_id:
        found = found.filter(project_id=token.project_id)
    return found


def projects(user, permission=LIST):
    """The projects in which the user (and their token) holds `permission`."""
    if token_of(user) is not None and token_of(user).read_only and needed_role(permission) != Role.VIEWER:
        return Project.objects.none()
    roles = Role.at_least(needed_role(permission))
    return Project.objects.filter(pk__in=memberships(user).filter(role__in=roles).values("project_id"))


def role_in(user, project):
    """The user's role in `project` (after their token's limits), or None for an outsider."""
    cache = user.__dict__.setdefault("_console_roles", {})
    if project.pk not in cache:
        found = memberships(user).filter(project=project).values_list("role", flat=True).first()
        cache[project.pk] = effective(Role(found) if found else None, user)
    return cache[project.pk]


def can(user, project, permission):
    role = role_in(user, project)
    return role is not None and permission in GRANTS[role]


def check(user, project, permission):
    """PermissionDenied unless the user's role in `project` grants `permission`."""
    role = role_in(user, project)
    if role is None:
        raise Http404(f"No project {project.slug}")
    if permission not in GRANTS[role]:
        wanted = needed_role(permission)
        capped = " (this API token is read-only)" if token_of(user) is not None and token_of(user).read_only else ""
        raise PermissionDenied(
            f"Your role in project '{project.slug}' is {role.label.lower()}{capped}; this needs "
            f"{wanted.label.lower()} ({permission})"
        )


def project(user, slug, permission=GET):
    found = Project.objects.filter(slug=slug, pk__in=memberships(user).values("project_id")).first()
    if found is None:
        raise Http404(f"No project {slug!r}")
    check(user, found, permission)
    return found


def clusters(user, permission=LIST):
    """Live clusters (drafts included) of the projects where the user holds `permission`."""
    return Cluster.objects.live().filter(project__in=projects(user, permission)).select_related("project")


def cluster(user, project_slug, name, permission=GET, *, drafts=True):
    """A live cluster of one of the user's projects; with drafts=False, a draft is not found either.
    404 when it is not there (or not the user's to see), then 403 when the role lacks `permission`."""
    found = (
        Cluster.objects.live()
        .filter(project__slug=project_slug, project__in=projects(user, LIST), name=name)
        .select_related("project")
    )
    if not drafts:
        found = found.exclude(status=ClusterStatus.DRAFT)
    found = found.first()
    if found is None:
        raise Http404(f"No cluster {project_slug}/{name}")
    check(user, found.project, permission)
    return found


def of_cluster(user, queryset, project_slug, name, permission=GET, **lookup):
    """The row of `queryset` (a model with a `cluster` foreign key: a run) matching `lookup`, of a cluster
    called `name` in one of the user's projects, live or deleted: what outlives its cluster (a run's
    page, its curves) is still found under the cluster's name. 404 / 403 as cluster()."""
    found = (
        queryset.filter(
            cluster__project__slug=project_slug, cluster__project__in=projects(user, LIST), cluster__name=name, **lookup
        )
        .select_related("cluster__project")
        .first()
    )
    if found is None:
        raise Http404(f"Nothing of that id on {project_slug}/{name}")
    check(user, found.cluster.project, permission)
    return found


def draft(user, project_slug, name):
    """A draft the user may go on editing (creating clusters is the admin's)."""
    found = clusters(user, LIST).filter(project__slug=project_slug, name=name, status=ClusterStatus.DRAFT).first()
    if found is None:
        raise Http404(f"No draft {project_slug}/{name}")
    check(user, found.project, CREATE)
    return found


def token_projects(raw):
    """(user id, {ids of the projects it may read}) for a raw bearer token, after its limits (one project,
    expiry), or None when it authenticates no one: the router's check, the same rule as every page's."""
    token = APIToken.authenticate(raw)
    if token is None:
        return None
    user = token.user
    user.api_token = token
    return user.pk, set(projects(user, GET).values_list("pk", flat=True))
