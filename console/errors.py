"""The console's user errors: one family, each carrying the HTTP status and google.rpc status it answers with.

Services raise them; each surface maps them in one place: /api/v1 in `api_exception_handler`
(console.safejson), the v1beta1 paths in `clusters.api.compat`, pages with `page_message()` and the
`errors` a form shows. A failure of work already accepted (a step, a Slurm call inside an operation)
is a `clusters.work.BackendError` instead: it goes on the operation and the timeline.
"""

from django.http import JsonResponse


class ConsoleError(Exception):
    """A request the console will not do, with a message for the user."""

    http_status = 400
    rpc_status = "INVALID_ARGUMENT"

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def body(self):
        """The /api/v1 answer's body."""
        return {"detail": self.message}


class FieldErrors(ConsoleError):
    """Bad fields: `errors` maps each field path to its reasons (a 400 naming every one)."""

    def __init__(self, errors):
        super().__init__("; ".join(f"{path}: {', '.join(reasons)}" for path, reasons in errors.items()))
        self.errors = errors

    def body(self):
        return self.errors


class Conflict(ConsoleError):
    """Not now: the cluster is busy or in a state the request does not fit."""

    http_status = 409
    rpc_status = "FAILED_PRECONDITION"


class AlreadyExists(ConsoleError):
    http_status = 409
    rpc_status = "ALREADY_EXISTS"


class QuotaExceeded(ConsoleError):
    http_status = 403
    rpc_status = "RESOURCE_EXHAUSTED"


class PermissionDenied(ConsoleError):
    """A member of the project whose role does not grant the action (an outsider gets 404 instead)."""

    http_status = 403
    rpc_status = "PERMISSION_DENIED"


class Unavailable(ConsoleError):
    """Something the request needs (a cluster's Slurm, a cloud API) is not answering; a retry may help."""

    http_status = 503
    rpc_status = "UNAVAILABLE"

    def __init__(self, message, *, retry_after=None):
        super().__init__(message)
        # Seconds after which a retry is worth it: the Retry-After header and google.rpc.RetryInfo.
        self.retry_after = retry_after


def page_message(exc):
    """The sentence a page shows for a ConsoleError (a flash message)."""
    if isinstance(exc, FieldErrors):
        return "; ".join(reason for reasons in exc.errors.values() for reason in reasons)
    return exc.message


def surface_error(request, http, detail, rpc_status, *, rpc_http=None, rpc_message=None):
    """The error answer of the API `request` is on: {"detail"} on /api/, google.rpc on /v1beta1/ (its
    own HTTP status and message where the service's differ); None on a page, which renders its own."""

    if request.path.startswith("/api/"):
        return JsonResponse({"detail": detail}, status=http)
    if request.path.startswith("/v1beta1/"):
        code = rpc_http or http
        error = {"code": code, "message": rpc_message or detail, "status": rpc_status}
        return JsonResponse({"error": error}, status=code)
    return None
