"""Print train.py's config for a catalog profile on its own layout, with no cluster: what a platform
engineer hands to `python -m recipes.node.memory CONFIG --ranks N` on a node (the memory one training
step takes there, traced on fake tensors) or to train.py itself."""

import json
import tempfile

from django.core.management.base import BaseCommand, CommandError

from console.errors import FieldErrors


class Command(BaseCommand):
    help = "Print train.py's JSON config for a recipe's profile on its catalog layout (and its rank count)."

    def add_arguments(self, parser):
        parser.add_argument("recipe", help="a catalog recipe id, e.g. llama3.1-70b-pretrain")
        parser.add_argument("--profile", default="full")
        parser.add_argument("--layers", type=int, help="this many decoder layers instead of the model's")
        parser.add_argument("--output-dir", help="the run folder the config names (default: a new temporary one)")

    def handle(self, *args, recipe, profile, layers, output_dir, **options):
        from recipes.runs.launch import offline_config

        if layers is not None and layers < 1:
            raise CommandError("--layers must be at least 1")
        folder = output_dir or tempfile.mkdtemp(prefix="tcc-config-")
        try:
            config, ranks = offline_config(recipe, folder, profile_name=profile, layers=layers)
        except FieldErrors as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.errors.items())) from None
        self.stdout.write(json.dumps(config, indent=2))
        self.stderr.write(f"{ranks} ranks: python -m recipes.node.memory CONFIG --ranks {ranks}")
