"""Periodic rounds fanned out per target (a cluster's Slurm sync, an endpoint's reconcile): at most one
round per target waits in the broker at a time, and a waiting round is not dropped for being late.

Each round used to expire when the next was due, so that a worker running behind would not pile them
up. But a worker steadily more than one interval behind (every periodic task shares its queue) then
found every round expired: the target was never synced or reconciled again until the worker caught up.
Now a round is sent only when none for its target is waiting: a Redis key per target, set (NX, with a
time to live) when the round is sent and deleted when it starts. A round that waits is run however late;
PERIODIC_ROUND_TIMEOUT frees the target if its message was lost (its message expires then too, so a
lost-and-found one never runs twice). Purging the queue by hand leaves the keys: rounds start again
after that timeout (tests/conftest.py's purge_queue deletes both).
"""

import contextlib
import math

import redis
from django.conf import settings

_clients = {}


def client():
    url = settings.CELERY_BROKER_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _clients[url]


def key(kind, target):
    """The key that says a `kind` round for `target` waits (named after the periodic queue, which each
    installation, and each test checkout, has of its own)."""
    return f"{settings.CELERY_PERIODIC_QUEUE}:waiting:{kind}:{target}"


def send(task, kind, target):
    """Send task(target) unless a `kind` round for `target` is waiting; returns whether it was sent."""
    timeout = max(1, math.ceil(settings.PERIODIC_ROUND_TIMEOUT))
    try:
        if not client().set(key(kind, target), "1", nx=True, ex=timeout):
            return False
    except redis.RedisError:
        pass  # the broker is not answering: the send below fails the same way, as it did before
    try:
        task.apply_async((target,), expires=timeout)
    except Exception:
        started(kind, target)  # not sent: the next beat may try again
        raise
    return True


def started(kind, target):
    """The round's first call: the next one may be sent from now on."""
    with contextlib.suppress(redis.RedisError):  # else its key times out
        client().delete(key(kind, target))
