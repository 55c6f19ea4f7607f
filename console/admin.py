"""Admin for API tokens: only the prefix is shown; the secret was never stored."""

from django.contrib import admin

from .models import APIToken


@admin.register(APIToken)
class APITokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created", "last_used"]
    readonly_fields = ["prefix", "created", "last_used"]
    fields = ["user", "name", "prefix", "created", "last_used"]

    def has_add_permission(self, request):
        # Tokens are issued on the tokens page or with `manage.py create_api_token`, which show the secret once.
        return False
