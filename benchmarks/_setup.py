"""The set-up every benchmark shares: a scratch folder, its own SQLite database and local clusters
there, Django configured from environment variables, and the repository on sys.path.

    from _setup import ROOT, WORK, scratch_django
    ENV = scratch_django(AUTO_REPAIR="false")   # extra settings as environment variables
    user, project = bench_project()              # after scratch_django: migrated, an admin "bench"

Run a benchmark as `.venv/bin/python benchmarks/NAME.py` (this folder is then on sys.path); with
BENCH_DATABASE_URL=postgres://... it uses that (empty) database instead of its own SQLite file.
"""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(tempfile.mkdtemp(prefix="tcc-bench-", dir="/tmp"))
WORK.chmod(0o755)  # slurmrestd runs as nobody and reads slurm.conf below here


def scratch_django(**env):
    """Point Django at the scratch folder (plus `env`), set it up, and return the environment used."""
    sys.path.insert(0, str(ROOT))
    values = {
        "DJANGO_SETTINGS_MODULE": "console.settings",
        # BENCH_DATABASE_URL runs it on another database (an empty PostgreSQL database, say).
        "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{WORK / 'bench.sqlite3'}",
        "LOCAL_CLUSTERS_DIR": str(WORK / "clusters"),
        "LOG_LEVEL": "WARNING",
        **env,
    }
    os.environ.update(values)
    import django

    django.setup()
    return values


def bench_project(gcp_project_id=""):
    """Migrate the scratch database; (user, project): "bench", admin of project "bench"."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from clusters.choices import Role
    from clusters.models import Project

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    project = Project.objects.create(slug="bench", name="Bench", gcp_project_id=gcp_project_id)
    project.members.add(user, through_defaults={"role": Role.ADMIN})
    return user, project
