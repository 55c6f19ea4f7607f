"""API tokens: only a digest is stored, so a leaked database does not leak working tokens."""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "tcc_"

LAST_USED_RESOLUTION = timedelta(minutes=1)


def digest(raw):
    return hashlib.sha256(raw.encode()).hexdigest()


class APIToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters, so a user can tell tokens apart without the secret being kept.
    prefix = models.CharField(max_length=12, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)
    # Limits on top of the user's own roles (clusters.access applies them): one project only, reads
    # only, and a last day.
    project = models.ForeignKey(
        "clusters.Project", models.CASCADE, null=True, blank=True, related_name="api_tokens",
        help_text="Only this project; empty: every project of the user",
    )  # fmt: skip
    read_only = models.BooleanField(default=False, help_text="Reads only (the viewer role), whatever the user's role")
    expires = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def expired(self):
        return self.expires is not None and self.expires <= timezone.now()

    @classmethod
    def issue(cls, user, name, *, project=None, read_only=False, expires=None):
        """Create a token and return (token, raw secret); the secret is shown once and never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, prefix=raw[:12], digest=digest(raw), project=project, read_only=read_only,
            expires=expires,
        )  # fmt: skip
        return token, raw

    @classmethod
    def authenticate(cls, raw):
        """The live token with this secret (its user active, not expired), or None."""
        token = cls.objects.select_related("user", "project").filter(digest=digest(raw)).first()
        if token is None or not token.user.is_active or token.expired:
            return None
        # "Last used" to the minute: a write per request would be most of an API read's cost.
        now = timezone.now()
        if token.last_used is None or now - token.last_used >= LAST_USED_RESOLUTION:
            cls.objects.filter(pk=token.pk).update(last_used=now)
        return token


class SignInFailure(models.Model):
    """A failed sign-in, kept for the throttle window (console.views.SignInView)."""

    username = models.CharField(max_length=150)
    address = models.GenericIPAddressField(null=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["username", "created"], name="signin_failures_by_user"),
            models.Index(fields=["address", "created"], name="signin_failures_by_address"),
        ]

    def __str__(self):
        return f"{self.username} from {self.address} at {self.created:%Y-%m-%d %H:%M:%S}"
