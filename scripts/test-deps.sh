#!/usr/bin/env bash
# test-deps.sh: installs what integration/wireformat_test.go needs to run the
# snippets of docs/wire-format.md, on Debian: redis-cli, redis-py for
# /usr/bin/python3, Node.js with npm, and ioredis in docs/snippets/node_modules.
# Idempotent: it installs only what is missing, so a second run takes a moment.
# (The Redis server itself is not installed here: the tests use $REDIS_ADDR.)
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo
updated=
apt_install() {
  if [ -z "$updated" ]; then
    $sudo apt-get update -qq
    updated=1
  fi
  echo "test-deps: apt-get install $*"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

command -v redis-cli >/dev/null || apt_install redis-tools
/usr/bin/python3 -c 'import redis' 2>/dev/null || apt_install python3-redis
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm
fi
if [ ! -d docs/snippets/node_modules ]; then
  echo "test-deps: npm ci --prefix docs/snippets"
  npm ci --prefix docs/snippets --no-audit --no-fund
fi
