#!/usr/bin/env bash
# Set up everything the tests need (packages, virtualenv, Redis) and run lint and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/pytest "$@"
