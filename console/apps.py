"""App config for the console shell (auth tokens, dashboard)."""

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
