#!/usr/bin/env bash
# Runs every check and test of Pelican on a fresh Debian machine: installs and
# starts what the tests need (redis-server, chromium for the dashboard's
# browser tests, the wire-format snippets' Python and Node clients), then
# gofmt, go vet and go test -race.
# Usage: scripts/test.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
# Headless Chromium for the dashboard's browser tests (dashboard/browser_test.go).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 && ! command -v google-chrome >/dev/null 2>&1; then
  need_apt+=(chromium fonts-dejavu-core)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

addr=${REDIS_ADDR:-127.0.0.1:6379}
host=${addr%:*}; port=${addr##*:}
if ! redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1; then
  echo "starting redis-server on $addr"
  redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no
  for _ in $(seq 100); do redis-cli -h "$host" -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
redis-cli -h "$host" -p "$port" ping >/dev/null

# PostgreSQL for the SQL idempotency store's tests (PG_DSN overrides the default).
if [ -z "${PG_DSN:-}" ]; then
  if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      echo "installing: postgresql"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
    for _ in $(seq 100); do pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null 2>&1; then
    # A fresh install: trust local TCP connections and create the test database.
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | sort -V | tail -1)
    grep -q '^host all all 127.0.0.1/32 trust' "$hba" || sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    su postgres -c "psql -c 'select pg_reload_conf()'" >/dev/null
    su postgres -c "createdb test" 2>/dev/null || true
  fi
fi

if [ -x scripts/test-deps.sh ]; then scripts/test-deps.sh; fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
# Every package, the integration package first: it takes about as long as
# all the others together (320 s of 670 s with -race, quiet), and in go
# test's own order it started after the others had run for two minutes. Given
# first, it runs beside them from the start (go test runs packages in the
# order given, GOMAXPROCS at a time).
go test -race -count=1 -timeout 20m "$@" ./integration/ $(go list ./... | grep -v '/integration$')
