"""The controller's TLS certificate: when it ends, and its rotation (clusters/tls.py has the design).

A ROTATE_TLS operation replaces a cluster's CA and controller certificate while everything runs:

1. the console keeps the current bundle with the new CA's certificate after it: it now pins both
   CAs (the agent still serves the old certificate; a controller that restarts too);
2. the agent is sent the new bundle over the connection the old CA vouches for, and serves it from
   its next connection on (its slurmrestd relay too);
3. the console keeps the new bundle alone: it pins the new CA only, and the old private key is gone
   (local: the file replaced; gce: the secret's older versions destroyed);
4. a connection pinned to the new CA alone proves the switch; the certificate's end is recorded.

Each run of the one step starts from what the console keeps, so a worker that dies part-way leaves a
state the rerun finishes from (it pins every CA kept so far and makes a fresh certificate). A request
another worker began with the old pin while the agent switched fails its handshake once and is retried.

    start_rotation(cluster, reason, user=None)   the operation (409 when the cluster is busy)
    rotate_due()                                  the daily task: start one for each certificate near its end
    record_expiry(cluster), known_expiry(cluster) the certificate's end into backend_state["tls"]
"""

import datetime
import logging

from django.utils import timezone

from .. import operations, tls
from ..backends import get_backend
from ..choices import ClusterStatus
from ..models import Cluster
from ..work import PermanentBackendError, Step

log = logging.getLogger(__name__)
ROTATE_TLS = "ROTATE_TLS"
RENEW_DAYS = tls.RENEW_DAYS  # a certificate is rotated when it has fewer days left than this


def record_expiry(cluster, backend=None, bundle=None, **more):
    """Note when the controller's certificate ends (backend_state["tls"]["not_after"], ISO 8601) for the
    cluster page and rotate_due(), from `bundle` or else the one the backend keeps; `more` (a new generation)
    is kept beside it. None where there is no bundle."""
    backend = backend or get_backend(cluster.backend)
    bundle = bundle or backend.tls_bundle(cluster)
    if bundle is None:
        return None
    ends = tls.not_after(bundle)
    state = {**(cluster.backend_state.get("tls") or {}), "not_after": ends.isoformat(), **more}
    backend.save_state(cluster, tls=state)
    return ends


def known_expiry(cluster, backend=None):
    """expires(), or the end read from the cluster's bundle and recorded the first time; None (logged) when it
    cannot be read: one cluster's unreadable bundle stops neither a create nor the daily round."""
    try:
        return expires(cluster) or record_expiry(cluster, backend)
    except Exception as exc:
        log.warning("cluster %s: its certificate's end could not be read: %s", cluster, exc)
        return None


def expires(cluster):
    """When the controller's certificate ends, as last recorded (an aware datetime), or None."""
    found = (cluster.backend_state.get("tls") or {}).get("not_after")
    return datetime.datetime.fromisoformat(found) if found else None


def rotate(ctx):
    """The operation's one step (see the module docstring)."""
    cluster, backend = ctx.cluster, ctx.backend
    kept = backend.tls_bundle(cluster)
    if kept is None:
        raise PermanentBackendError(
            "there is no controller certificate to rotate: the console does not reach this cluster's controller "
            f"on {backend.label} (or the cluster was made before the console used TLS)"
        )
    generation = (cluster.backend_state.get("tls") or {}).get("generation", 0)
    new = tls.renewed(kept)
    backend.store_tls(cluster, tls.trusting(kept, new))
    record_expiry(cluster, backend, kept, generation=generation + 1)
    ctx.heartbeat("the agent switches to the new certificate")
    backend.agent(cluster).tls(new)
    backend.store_tls(cluster, new)
    record_expiry(cluster, backend, new, generation=generation + 2, rotated=timezone.now().isoformat())
    backend.agent(cluster).stat(".")  # pinned to the new CA alone now
    backend.slurm(cluster).ping()  # and slurmrestd's relay serves the new certificate too


operations.register(
    operations.Kind(
        name=ROTATE_TLS,
        label="Certificate rotation",
        metadata_type="GenericOperationMetadata",
        starts_from=frozenset(ClusterStatus.usable()),
        steps=lambda ctx: [Step("Rotate the controller's TLS certificate and its CA", rotate)],
        response="empty",
    )
)


# A new cluster's certificate end is on its page from the start (else the daily round reads it).
operations.extend("CREATE", operations.Extension(after_success=lambda ctx: known_expiry(ctx.cluster, ctx.backend)))


def start_rotation(cluster, reason, user=None):
    return operations.start(cluster, ROTATE_TLS, user=user, message=f"Rotating the controller's certificate: {reason}")


def rotate_due(now=None):
    """Start a rotation on every usable cluster whose certificate ends within RENEW_DAYS (its end read
    from its bundle the first time); a busy cluster is tried again tomorrow. The ids of those started."""
    from console.errors import Conflict

    now = now or timezone.now()
    started = []
    for cluster in Cluster.objects.filter(status__in=ClusterStatus.usable()).select_related("project"):
        ends = known_expiry(cluster)
        if ends is None or ends - now > datetime.timedelta(days=RENEW_DAYS):
            continue
        try:
            started.append(start_rotation(cluster, f"it ends on {ends:%Y-%m-%d}").pk)
        except Conflict:
            log.info("cluster %s is busy: its certificate is rotated on a later round", cluster)
    return started
