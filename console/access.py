"""What a user may see: their projects, and the clusters and runs in them. Every page, both APIs, the
compatible paths and the proxies ask here, so the rule is written once.

A lookup that finds nothing, or finds something outside the user's projects, raises Http404 (pages
answer 404, DRF a JSON 404, v1beta1 maps it to its own NOT_FOUND / PERMISSION_DENIED): an outsider
cannot tell a project or cluster exists.
"""

from django.http import Http404

from clusters.choices import ClusterStatus
from clusters.models import Cluster, Project


def projects(user):
    return Project.objects.for_user(user)


def project(user, slug):
    found = projects(user).filter(slug=slug).first()
    if found is None:
        raise Http404(f"No project {slug!r}")
    return found


def clusters(user):
    """Live clusters (drafts included) of the user's projects."""
    return Cluster.objects.live().filter(project__in=projects(user)).select_related("project")


def cluster(user, project_slug, name, *, drafts=True):
    """A live cluster of one of the user's projects; with drafts=False, a draft is not found either."""
    found = clusters(user).filter(project__slug=project_slug, name=name)
    if not drafts:
        found = found.exclude(status=ClusterStatus.DRAFT)
    found = found.first()
    if found is None:
        raise Http404(f"No cluster {project_slug}/{name}")
    return found


def draft(user, project_slug, name):
    found = clusters(user).filter(project__slug=project_slug, name=name, status=ClusterStatus.DRAFT).first()
    if found is None:
        raise Http404(f"No draft {project_slug}/{name}")
    return found
