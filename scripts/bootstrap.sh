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

REDIS_PORT=${REDIS_PORT:-6379}
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  mkdir -p var
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --save "" --appendonly no \
    --logfile "$PWD/var/redis.log" --dir "$PWD/var"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
redis-cli -p "$REDIS_PORT" ping >/dev/null

# Fail here, in one line, rather than later behind a daemon's timeout.
.venv/bin/python -c "import sys; from clusters.backends.local.preflight import main; sys.exit(main())"
