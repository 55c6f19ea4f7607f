"""The POSIX account each console user's work runs as on a cluster, and the group of each project.

Users' jobs never run as root: `:callSlurmRestApi` calls reach slurmrestd with a JWT minted for the
caller's account, so Slurm runs what they submit as that account. Each project has a group; its
members' accounts are in it, and a cluster's shared home belongs to it (mode 3770), so one
project's files are unreadable to another's accounts. The console's own operations (provisioning,
health scans, repairs) keep the service account.
"""

import re
from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class Account:
    name: str  # the POSIX user name (at most 32 characters, [a-z0-9_-], starting with a letter)
    group: str  # the project's POSIX group


def safe(text, length):
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:length].strip("-") or "x"


def project_group(project):
    """The POSIX group of `project`'s accounts: the only group its clusters' partitions and munge socket
    admit (besides root, the console's own work)."""
    return f"{settings.POSIX_ACCOUNT_PREFIX}p-{safe(project.slug, 16)}-{project.pk}"


def account_for(user, project):
    """The account `user` works as in `project`'s clusters; the user's id keeps two names apart."""
    prefix = settings.POSIX_ACCOUNT_PREFIX
    return Account(name=f"{prefix}{safe(user.get_username(), 18)}-{user.pk}", group=project_group(project))
