#!/usr/bin/env bash
# Runs every check and test of Pelican on a fresh Debian machine: installs and
# starts what the tests need (redis-server, the wire-format snippets' Python
# and Node clients), then gofmt, go vet and go test -race.
# Usage: scripts/test.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
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

if [ -x scripts/test-deps.sh ]; then scripts/test-deps.sh; fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
go test -race -count=1 -timeout 10m "$@" ./...
