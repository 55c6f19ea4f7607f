#!/usr/bin/env bash
# Set up and run the console on this machine: local Slurm backend, SQLite, Redis, one Celery worker
# (with the beat scheduler) and the web server on http://127.0.0.1:8000/. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export DJANGO_SETTINGS_MODULE=console.settings
.venv/bin/python manage.py migrate --no-input -v0
.venv/bin/python manage.py collectstatic --no-input -v0
# First run: CONSOLE_ADMIN_PASSWORD=... creates the admin user and a 'default' project.
.venv/bin/python manage.py bootstrap_console
mkdir -p var
.venv/bin/celery -A console worker --beat --loglevel=INFO --concurrency=2 \
  --queues celery,periodic --schedule var/celerybeat-schedule >var/worker.log 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT INT TERM
echo "Celery worker running (log: var/worker.log)."
echo "Console: http://127.0.0.1:${PORT:-8000}/"
.venv/bin/python manage.py runserver "127.0.0.1:${PORT:-8000}"
