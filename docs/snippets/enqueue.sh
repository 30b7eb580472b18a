#!/usr/bin/env bash
# Enqueue two Pelican jobs with redis-cli (wire format v1, docs/wire-format.md).
set -euo pipefail
cli=(redis-cli -e -h "${REDIS_HOST:-127.0.0.1}" -p "${REDIS_PORT:-6379}")
stream="${PELICAN_STREAM:-jobs}"

# (a) The smallest valid job: a type and a payload. Every other field takes its default.
"${cli[@]}" XADD "$stream" '*' type email.send payload '{"to":"a@example.com"}'

# (b) A job with every optional field a producer writes.
now_ms=$(date +%s%3N)                               # GNU date: Unix time in milliseconds
trace_id=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
span_id=$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')
"${cli[@]}" XADD "$stream" '*' \
  v 1 \
  type invoice.send \
  payload '{"invoice_id":1042,"email":"ann@example.com"}' \
  content_type application/json \
  job_id "$(cat /proc/sys/kernel/random/uuid)" \
  idempotency_key invoice-1042-send \
  attempt 0 \
  max_attempts 5 \
  created_at "$now_ms" \
  lock_key invoice:1042 \
  traceparent "00-$trace_id-$span_id-01" \
  tracestate rojo=00f067aa0ba902b7 \
  h.tenant acme \
  origin billing-cron
