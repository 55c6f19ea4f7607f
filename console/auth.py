"""DRF authentication with console API tokens sent as `Authorization: Bearer <token>`; the scrape token
Prometheus sends for /metrics (the console's and the router's)."""

import hmac
from pathlib import Path

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .models import APIToken


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid authorization header: expected 'Bearer <token>'.")
        token = APIToken.authenticate(header[1].decode(errors="replace"))
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        # clusters.access reads the token's limits (project, read-only) from the user it checks.
        token.user.api_token = token
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The schema's security scheme for console tokens (Swagger UI's Authorize button uses it)."""

    target_class = "console.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A console API token (tcc_...)."}


def scrape_token():
    """The token METRICS_TOKEN_FILE holds, or "" when /metrics is off. Read from a file so it is never
    in a process's command line or environment listing."""
    path = settings.METRICS_TOKEN_FILE
    return Path(path).read_text().strip() if path and Path(path).is_file() else ""


def scrape_allowed(authorization):
    """None when /metrics is off (answer 404), else whether `authorization` ("Bearer <token>") holds
    the scrape token."""
    expected = scrape_token()
    if not expected:
        return None
    given = authorization.partition(" ")[2]
    return hmac.compare_digest(given.encode(errors="replace"), expected.encode())
