"""The console project package: settings, URLs, the Celery app, auth and the dashboard shell."""

from .celery import app as celery_app

__all__ = ("celery_app",)
