#!/usr/bin/env bash
# The console's embedded model registry: an MLflow tracking server bound to 127.0.0.1, a SQLite
# backend store and an artifact folder, behind MLflow's basic-auth app: the local backend runs users'
# jobs on this host, and without credentials any job could move any project's production alias.
# The console is its only client (account "console", password generated once into FOLDER/password,
# 0600, read by the console's settings: MLFLOW_PASSWORD_FILE). Production points the console at an
# MLflow server on PostgreSQL and a GCS bucket instead (docs/registry.md).
#   scripts/mlflow.sh [FOLDER (var/mlflow)] [PORT (5070)]
set -euo pipefail
cd "$(dirname "$0")/.."
folder=$(realpath -m "${1:-var/mlflow}")
port=${2:-5070}
mkdir -p "$folder/artifacts"
chmod 0700 "$folder"
for name in password flask_secret; do  # the console's password; the key of the auth app's CSRF tokens
  if [ ! -s "$folder/$name" ]; then
    (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))' >"$folder/$name.new" &&
      mv "$folder/$name.new" "$folder/$name")
  fi
done
# The first start creates the admin account from this file; later starts find it in auth.db.
(umask 077 && cat >"$folder/auth.ini" <<INI
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///$folder/auth.db
admin_username = console
admin_password = $(cat "$folder/password")
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
)
export MLFLOW_AUTH_CONFIG_PATH="$folder/auth.ini"
MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$folder/flask_secret")
export MLFLOW_FLASK_SERVER_SECRET_KEY  # the environment: never the command line `ps` shows
# MLFLOW_ARTIFACTS_DESTINATION (gs://bucket/prefix, s3://...) puts the artifacts in a bucket instead of
# FOLDER/artifacts: a store that takes multipart uploads, so checkpoints over RUN_ARCHIVE_MAX_BYTES are
# kept too (docs/registry.md).
# MLflow 3's job runner starts six huey consumers (~250 MB each) for features the console does not use.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec .venv/bin/mlflow server --app-name basic-auth --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$folder/mlflow.db" --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-$folder/artifacts}"
