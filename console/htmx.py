"""htmx helpers: one view renders the full page or just the fragment htmx asked for."""

from django.http import HttpResponse
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers

# htmx stops polling when a response has this status (https://htmx.org/docs/#polling).
HTMX_STOP_POLLING = 286


def htmx_partial(request):
    """True when htmx asked for a fragment (and did not ask to boost a whole page)."""
    return request.headers.get("HX-Request") == "true" and request.headers.get("HX-Boosted") != "true"


def render_fragment(request, template, context, *, done=False):
    """Render a polled fragment; `done` answers 286 so htmx stops polling."""
    html = render_to_string(template, context, request=request)
    response = HttpResponse(html, status=HTMX_STOP_POLLING if done else 200)
    patch_vary_headers(response, ["HX-Request"])
    return response
