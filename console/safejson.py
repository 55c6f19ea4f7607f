"""JSON parsing with limits, so a huge or absurdly nested body gets a clear 400 instead of a 500."""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .errors import ConsoleError


class JSONTooLarge(ValueError):
    pass


def refuse_constant(name):
    # Python's json reads NaN, Infinity and -Infinity, which are not JSON (RFC 8259) and which no
    # field of ours can hold; refuse them at the door rather than let one reach a model or a template.
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def nesting_depth(text):
    """The deepest nesting of [ and { outside strings, without building anything."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads(text, *, max_bytes=None, max_depth=None):
    """json.loads with a size and a nesting limit; raises JSONTooLarge or json.JSONDecodeError."""
    max_bytes = max_bytes or settings.JSON_MAX_BYTES
    max_depth = max_depth or settings.JSON_MAX_DEPTH
    raw = text if isinstance(text, bytes) else text.encode()
    if len(raw) > max_bytes:
        raise JSONTooLarge(f"the JSON document is larger than the limit of {max_bytes:,} bytes")
    text = raw.decode("utf-8")
    if nesting_depth(text) > max_depth:
        raise JSONTooLarge(f"the JSON document is nested deeper than {max_depth} levels")
    return json.loads(text, parse_constant=refuse_constant)


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(settings.JSON_MAX_BYTES + 1) if stream is not None else b""
        try:
            return loads(raw)
        except JSONTooLarge as exc:
            raise ParseError(f"Request body refused: {exc}.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def api_exception_handler(exc, context):
    """/api/v1's one mapping of errors: a ConsoleError answers with its own status and body (field
    errors keyed by path, else {"detail"}), a body over Django's upload limit gets a clear 413, and
    everything else is DRF's."""

    if isinstance(exc, ConsoleError):
        response = Response(exc.body(), status=exc.http_status)
        if getattr(exc, "retry_after", None):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response({"detail": f"Request body refused: it is larger than {limit:,} bytes."}, status=413)
    return exception_handler(exc, context)
