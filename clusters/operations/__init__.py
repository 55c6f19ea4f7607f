"""The operations engine: every long piece of work on a cluster is an Operation of a registered kind.

    start(cluster, kind, message=..., params=...)   the one way to start work (start.py)
    register(Kind(...)) / extend(name, Extension(...))   kinds, by the code that owns them (registry.py)
    engine.run(id) / engine.fail(id, message)        claim, steps, heartbeat, finish, fail (engine.py)
    resume_stale()                                   re-enqueue orphaned operations (tasks.py)

The engine knows no kind by name; see docs/operations.md.
"""

from .registry import Extension, Kind, extend, kind, kinds, register
from .start import start
from .tasks import resume_stale_operations as resume_stale

__all__ = ["Extension", "Kind", "extend", "kind", "kinds", "register", "resume_stale", "start"]
