"""Check a cluster spec against its backend before creating it (gce: APIs, quotas, reservations)."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from clusters import services
from clusters.models import Project
from clusters.spec import SpecError
from console.errors import ConsoleError


class Command(BaseCommand):
    help = (
        "Check SPEC (a cluster JSON file) for project PROJECT: on gce, that the Google Cloud project has the "
        "APIs enabled, the quotas and the reservations the spec needs. Exits 1 when a check fails."
    )

    def add_arguments(self, parser):
        parser.add_argument("spec", help="the cluster's JSON spec, as for a create")
        parser.add_argument("--project", required=True, help="the console project's slug")

    def handle(self, spec, project, **options):
        found = Project.objects.filter(slug=project).first()
        if found is None:
            raise CommandError(f"No project '{project}'")
        try:
            data = json.loads(Path(spec).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"Cannot read {spec}: {exc}") from None
        try:
            findings = services.preflight(project=found, spec=data)
        except SpecError as exc:
            problems = "; ".join(f"{path}: {', '.join(reasons)}" for path, reasons in exc.errors.items())
            raise CommandError(f"The spec is not valid: {problems}") from None
        except ConsoleError as exc:
            raise CommandError(exc.message) from None
        if not findings:
            self.stdout.write("Nothing to check for this backend.")
        for finding in findings:
            self.stdout.write(f"{finding.status.upper():4s}  {finding.check}: {finding.detail}")
        failed = [f for f in findings if f.status == "fail"]
        if failed:
            raise CommandError(f"{len(failed)} of {len(findings)} checks failed")
