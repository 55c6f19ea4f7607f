"""Thin Celery tasks over recipes.services."""

from celery import shared_task

from . import services


@shared_task(soft_time_limit=60)
def refresh_active_runs():
    services.refresh_active_runs()
