#!/usr/bin/env bash
# A private PostgreSQL for the tests (and benchmarks) on this machine: its own data folder and a Unix
# socket only (no TCP port), in a folder only its owner enters, so users' jobs on this host cannot
# reach it. Idempotent: initialises once, starts it if it is not running, prints nothing on success.
#   bash scripts/postgres.sh        then   DATABASE_URL="postgres://postgres@/console?host=$PGDIR&port=$PGPORT"
set -euo pipefail
PGDIR=${PGDIR:-/tmp/tcc-postgres}
PGPORT=${PGPORT:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "PostgreSQL is not installed (apt package postgresql, scripts/apt-packages.txt)" >&2; exit 1; }
install -d -m 0700 -o postgres -g postgres "$PGDIR"
if [ ! -f "$PGDIR/data/PG_VERSION" ]; then
  runuser -u postgres -- "$bin/initdb" -D "$PGDIR/data" -A trust -U postgres >"$PGDIR/initdb.log"
fi
if ! runuser -u postgres -- "$bin/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; then
  runuser -u postgres -- "$bin/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/postgres.log" -w \
    -o "-p $PGPORT -k $PGDIR -c listen_addresses='' -c max_connections=200 -c fsync=off" start >/dev/null
fi
