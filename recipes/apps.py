"""App config for recipes."""

from django.apps import AppConfig


class RecipesConfig(AppConfig):
    name = "recipes"
