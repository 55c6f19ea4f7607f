"""Rate limits on both REST surfaces (/api/v1 and the service's /v1beta1 paths), per signed-in user:
reads and writes counted apart, so a dashboard polling its clusters never uses up the budget a
script needs to create or delete one. Over the limit: 429 with Retry-After (the v1beta1 paths in
Google's shape, RESOURCE_EXHAUSTED). Counts live in Django's cache: per process by default, shared by
every web server with CACHE_URL=redis://... (docs/scaling.md)."""

from django.conf import settings
from rest_framework.throttling import UserRateThrottle

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


class PerUser(UserRateThrottle):
    setting = ""  # the setting that holds this throttle's requests per minute

    def get_rate(self):
        # Read when each request is checked (not at import, as DRF's rates are): settings may change.
        return f"{getattr(settings, self.setting)}/min"

    def counts(self, request):
        raise NotImplementedError

    def allow_request(self, request, view):
        return not self.counts(request) or super().allow_request(request, view)


class Reads(PerUser):
    scope = "reads"
    setting = "API_READS_PER_MINUTE"

    def counts(self, request):
        return request.method in SAFE


class Writes(PerUser):
    scope = "writes"
    setting = "API_WRITES_PER_MINUTE"

    def counts(self, request):
        return request.method not in SAFE
