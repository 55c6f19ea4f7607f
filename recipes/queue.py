"""Enqueue a task of recipes/tasks.py by its name once the transaction commits.

The services sit below the thin tasks that wrap them (recipes.tasks imports the services), so a
service names its follow-up task instead of importing it; the app's ready() has imported the tasks."""

from celery import current_app
from django.db import transaction


def later(name, *args):
    """recipes.tasks.<name>.delay(*args), after the current transaction commits (at once outside one)."""
    task = f"recipes.tasks.{name}"
    transaction.on_commit(lambda: current_app.tasks[task].delay(*args))
