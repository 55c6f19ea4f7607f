"""The cluster timeline: one function records an event (and logs it) for every part of the console."""

import logging

from .choices import EventLevel
from .models import ClusterEvent

log = logging.getLogger("clusters.events")


def record_event(cluster, message, *, level=EventLevel.INFO, operation=None, node=""):
    log.info("cluster %s: %s", cluster, message)
    return ClusterEvent.objects.create(cluster=cluster, message=message, level=level, operation=operation, node=node)
