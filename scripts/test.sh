#!/usr/bin/env bash
# Set up everything the tests need (packages, virtualenv, Redis) and run lint, the import contracts
# and the whole suite on SQLite, then the modules whose correctness depends on the database (the
# operations engine and its one-active-operation constraint, the sync, access, both APIs, four
# workers at once) again on PostgreSQL. Arguments go to pytest instead, for one run on SQLite, e.g.
# -m "not slurm and not worker" for the fast loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The layers (.importlinter): pages -> services -> operations -> backends -> slurm, never back up.
.venv/bin/lint-imports
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
.venv/bin/pytest --durations=30  # the slowest, for keeping the suite under about 25 minutes
bash scripts/postgres.sh
export DATABASE_URL="postgres://postgres@/console?host=${PGDIR:-/tmp/tcc-postgres}&port=${PGPORT:-55432}"
exec .venv/bin/pytest tests/test_concurrency.py tests/test_operations.py tests/test_sync.py tests/test_api.py \
  tests/test_roles.py tests/test_compat_api.py tests/test_run_alerts.py
