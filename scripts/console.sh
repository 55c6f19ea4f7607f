#!/usr/bin/env bash
# Set up and run the console on this machine: local Slurm backend, SQLite, Redis, one Celery worker
# (with the beat scheduler), the model registry (MLflow), the inference router and the web server on
# http://127.0.0.1:8000/ (gunicorn; `--dev` for Django's development server instead).
# Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export DJANGO_SETTINGS_MODULE=console.settings
.venv/bin/python manage.py migrate --no-input -v0
.venv/bin/python manage.py collectstatic --no-input -v0
# First run: CONSOLE_ADMIN_PASSWORD=... creates the admin user and a 'default' project.
.venv/bin/python manage.py bootstrap_console
mkdir -p var
# The model registry (MLflow on 127.0.0.1:5070, its data under var/mlflow/), unless MLFLOW_TRACKING_URI
# names one already running.
registry=
if [ -z "${MLFLOW_TRACKING_URI:-}" ]; then
  bash scripts/mlflow.sh var/mlflow 5070 >var/mlflow.log 2>&1 &
  registry=$!
fi
.venv/bin/celery -A console worker --beat --loglevel=INFO --concurrency=2 \
  --queues celery,periodic --schedule var/celerybeat-schedule >var/worker.log 2>&1 &
worker=$!
# The inference router (OpenAI-compatible API and :predict in front of every endpoint's replicas).
.venv/bin/python manage.py router >var/router.log 2>&1 &
router=$!
trap 'kill $worker $registry $router 2>/dev/null; wait $worker $registry $router 2>/dev/null' EXIT INT TERM
echo "Celery worker running (log: var/worker.log); model registry: ${MLFLOW_TRACKING_URI:-http://127.0.0.1:5070} (log: var/mlflow.log)."
echo "Inference router: http://127.0.0.1:${ROUTER_PORT:-8100}/<project>/<endpoint>/v1/... (log: var/router.log)."
echo "Console: http://127.0.0.1:${PORT:-8000}/"
if [ "${1:-}" = "--dev" ]; then
  # Django's development server (reloads on code changes); never for anyone else to use.
  web=(.venv/bin/python manage.py runserver "127.0.0.1:${PORT:-8000}")
else
  # gunicorn, WhiteNoise serving the collected static files; the access log beside the others.
  web=(.venv/bin/gunicorn console.wsgi --bind "127.0.0.1:${PORT:-8000}" --workers "${WEB_WORKERS:-3}"
    --timeout 60 --no-control-socket --access-logfile var/access.log --error-logfile -)
fi
"${web[@]}" &
server=$!
# In the background and waited for, so that a TERM to this script stops everything at once.
trap 'kill $worker $registry $router $server 2>/dev/null; wait $worker $registry $router $server 2>/dev/null' EXIT INT TERM
wait $server
