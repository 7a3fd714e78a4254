#!/usr/bin/env bash
# Install what the tracking-server tests need: Debian's PostgreSQL server binaries (initdb, pg_ctl,
# createdb under /usr/lib/postgresql/<major>/bin). The tests start a throw-away cluster of their own in a
# temporary folder; the cluster Debian's package creates and starts is not used.
# Idempotent: returns at once when the binaries are there. psycopg2 (mlflow's PostgreSQL driver) comes
# from the project's dev extra, not from here.
set -euo pipefail

have() { compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; }

if have; then
  echo "install_postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -n 1) already installed"
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install_postgres: not root, cannot apt-get install postgresql; the tracking-server tests will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
have || { echo "install_postgres: postgresql installed but no initdb/pg_ctl in /usr/lib/postgresql/*/bin" >&2; exit 1; }
echo "install_postgres: $(ls -d /usr/lib/postgresql/*/bin | tail -n 1) installed"
