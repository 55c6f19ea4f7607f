#!/usr/bin/env bash
# The console's embedded model registry: an MLflow tracking server bound to 127.0.0.1 (the console is
# its only client), a SQLite backend store and an artifact folder. Production points the console at an
# MLflow server on PostgreSQL and a GCS bucket instead (docs/registry.md).
#   scripts/mlflow.sh [FOLDER (var/mlflow)] [PORT (5070)]
set -euo pipefail
cd "$(dirname "$0")/.."
folder=$(realpath -m "${1:-var/mlflow}")
port=${2:-5070}
mkdir -p "$folder/artifacts"
# MLflow 3's job runner starts six huey consumers (~250 MB each) for features the console does not use.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec .venv/bin/mlflow server --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$folder/mlflow.db" --artifacts-destination "$folder/artifacts"
