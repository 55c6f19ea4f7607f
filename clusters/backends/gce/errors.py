"""Compute Engine errors as BackendErrors that say what to do: which quota, which permission, no capacity."""

import re

from ...work import CapacityError, PermanentBackendError, TransientBackendError

CAPACITY_CODES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "NOT_ENOUGH_RESOURCES_AVAILABLE",
    "RESERVATION_CAPACITY_EXCEEDED",
}


# Rate limits answer 403 with these reasons: wait and try again, it is no missing permission.
# https://cloud.google.com/compute/api-quotas#rate_limits ("rateLimitExceeded" on 403s)
RATE_LIMIT_CODES = {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}

QUOTA = re.compile(r"Quota '(?P<quota>[A-Z0-9_]+)' exceeded\.\s+Limit: (?P<limit>[\d.]+)(?: in (?P<where>[\w -]+))?")
SERVICE_ACCOUNT_UNSEEN = re.compile(r"Service account \S+ does not exist|does not have access to service account", re.I)
PERMISSION = re.compile(r"Required '(?P<permission>[\w.]+)' permission for '(?P<resource>[^']+)'")


def map_operation_errors(errors, what):
    first = errors[0]
    return map_message(first.code, first.message, what)


def map_api_error(exc, what=""):
    reason = ""
    for error in getattr(exc, "errors", None) or []:
        reason = (error.get("reason") if isinstance(error, dict) else "") or reason
    return map_message(
        reason or type(exc).__name__,
        exc.message if hasattr(exc, "message") else str(exc),
        what,
        getattr(exc, "code", None),
    )


def map_message(code, message, what, http_status=None):
    """A user-facing BackendError for a Compute error: which quota, which permission, which capacity."""
    prefix = f"{what}: " if what else ""
    if code in RATE_LIMIT_CODES:  # before quotas: a rate limit's message names a quota too
        return TransientBackendError(f"{prefix}Compute's API rate limit was reached ({code}); retrying with backoff")
    quota = QUOTA.search(message or "")
    if code == "QUOTA_EXCEEDED" or quota:
        if quota:
            where = f" in {quota['where'].strip()}" if quota["where"] else ""
            return PermanentBackendError(
                f"{prefix}quota {quota['quota']} exceeded{where}: the limit is {float(quota['limit']):g}; "
                "ask for more quota or fewer nodes"
            )
        return PermanentBackendError(f"{prefix}quota exceeded: {message}")
    permission = PERMISSION.search(message or "")
    if permission or http_status == 403 or code in ("forbidden", "Forbidden"):
        detail = (
            f"the credentials lack {permission['permission']} on {permission['resource']}" if permission else message
        )
        return PermanentBackendError(f"{prefix}permission denied: {detail}")
    if SERVICE_ACCOUNT_UNSEEN.search(message or ""):
        # A new service account is not seen everywhere for a minute (identity.py); the engine's retries
        # outlast that, and a real lack of iam.serviceAccountUser fails after them with this message.
        return TransientBackendError(
            f"{prefix}{message} (a new service account takes a minute to be seen everywhere; if this persists, "
            "the console needs roles/iam.serviceAccountUser on it)"
        )
    if code in CAPACITY_CODES or "does not have enough resources" in (message or ""):
        return CapacityError(f"{prefix}no capacity in the zone or reservation right now ({code})")
    if "machineType" in (message or "") or "Machine type" in (message or ""):
        return PermanentBackendError(f"{prefix}invalid machine type for this zone: {message}")
    if http_status in (429, 500, 502, 503, 504) or code in ("backendError", "ServiceUnavailable"):
        return TransientBackendError(f"{prefix}{message}")
    return PermanentBackendError(f"{prefix}{message}")
