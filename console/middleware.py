"""Request-level limits that must hold before a view (or Django's multipart parser) reads the body."""

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import render

from .errors import ConsoleError, page_message, surface_error


class RequestSizeLimit:
    """Refuse a body whose Content-Length is over REQUEST_MAX_BYTES with a 413, before it is read.

    Django caps form fields (DATA_UPLOAD_MAX_MEMORY_SIZE) but not uploaded files, which it streams to
    a temporary folder however large they are; no request of this console needs more than a spec file.
    Each surface gets its own error shape."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.REQUEST_MAX_BYTES
        if length > limit:
            message = f"Request body refused: it is larger than {limit:,} bytes."
            answer = surface_error(
                request, 413, message, "INVALID_ARGUMENT", rpc_http=400,
                rpc_message=f"Request payload size exceeds the limit: {limit} bytes.",
            )  # fmt: skip
            return answer or HttpResponse(message, status=413, content_type="text/plain")
        return self.get_response(request)


class ConsoleErrorPages:
    """A ConsoleError that reaches a page (a role check, mostly) answers with its status and sentence
    instead of a 500. DRF views and the v1beta1 paths render their own errors before this sees them."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):

        if not isinstance(exception, ConsoleError):
            return None
        return render(
            request, "console/refused.html", {"message": page_message(exception)}, status=exception.http_status
        )
