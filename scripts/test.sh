#!/usr/bin/env bash
# Set up everything the tests need (packages, virtualenv, Redis) and run lint, the import contracts
# and the whole suite. Arguments go to pytest, e.g. -m "not slurm and not worker" for the fast loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The layers (.importlinter): pages -> services -> operations -> backends -> slurm, never back up.
.venv/bin/lint-imports
exec .venv/bin/pytest "$@"
