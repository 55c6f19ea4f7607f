"""DRF authentication with console API tokens sent as `Authorization: Bearer <token>`."""

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
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
