#!/usr/bin/env bash
# Install what the console needs on a fresh Debian 12 machine (idempotent): system packages, a virtualenv
# with the Python dependencies, and a running Redis. Run as root (or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t APT_PACKAGES < <(grep -v '^\s*\(#\|$\)' scripts/apt-packages.txt)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "Installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's packages start system-wide daemons we do not use: each cluster runs its own.
for unit in slurmctld slurmd munge; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$unit" 2>/dev/null; then
    systemctl stop "$unit" || true
  fi
done

# Users' jobs (recipe runs) run the venv's interpreter as the users' own accounts, so it must live
# where every account can reach it: Debian's python3, not one under /root (pyenv's, say).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if /usr/bin/python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PYTHON=/usr/bin/python3
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
REQUIREMENTS=${REQUIREMENTS:-requirements-dev.txt}
stamp=".venv/.installed-$(sha256sum requirements.txt "$REQUIREMENTS" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  touch "$stamp"
fi

# Redis with a password: the local backend runs users' jobs on this host, and an open Redis would let
# any job queue a Celery task (which runs as root). The password is generated once per machine into
# REDIS_DIR (root only, 0700/0600) and reaches redis-server through its config file and redis-cli
# through REDISCLI_AUTH, never a command line (which `ps` shows to every account). The console's
# settings read it from there (REDIS_PASSWORD_FILE).
REDIS_PORT=${REDIS_PORT:-6379}
REDIS_DIR=${REDIS_DIR:-/var/lib/tcc/redis}
install -d -m 0700 "$REDIS_DIR"
if [ ! -s "$REDIS_DIR/password" ]; then
  (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$REDIS_DIR/password.new" &&
    mv "$REDIS_DIR/password.new" "$REDIS_DIR/password")
fi
redis_pong() { REDISCLI_AUTH="$(cat "$REDIS_DIR/password")" redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -qx PONG; }
if ! redis_pong; then
  if env -u REDISCLI_AUTH redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -qx PONG; then
    # An open Redis on the port. One an older bootstrap started (its folder a checkout's var/) is
    # stopped and started again with the password; any other is not ours to change.
    dir=$(env -u REDISCLI_AUTH redis-cli -p "$REDIS_PORT" config get dir | tail -n 1)
    if [ "$(basename "$dir")" = var ] && [ -f "$dir/redis.log" ]; then
      env -u REDISCLI_AUTH redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
      for _ in $(seq 50); do env -u REDISCLI_AUTH redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || break; sleep 0.1; done
    else
      echo "A Redis without a password answers on port $REDIS_PORT; stop it, or set REDIS_PORT to a free port" >&2
      exit 1
    fi
  fi
  (umask 077 && cat >"$REDIS_DIR/redis.conf" <<CONF
port $REDIS_PORT
bind 127.0.0.1
requirepass $(cat "$REDIS_DIR/password")
daemonize yes
save ""
appendonly no
dir $REDIS_DIR
logfile $REDIS_DIR/redis.log
CONF
  )
  redis-server "$REDIS_DIR/redis.conf"
  for _ in $(seq 50); do redis_pong && break; sleep 0.1; done
fi
redis_pong || { echo "Redis is not answering on port $REDIS_PORT (log: $REDIS_DIR/redis.log)" >&2; exit 1; }

# Fail here, in one line, rather than later behind a daemon's timeout.
.venv/bin/python -c "import sys; from clusters.backends.local.preflight import main; sys.exit(main())"
