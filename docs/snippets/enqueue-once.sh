#!/usr/bin/env bash
# Enqueue a job at most once per idempotency key within a window, with redis-cli and Pelican's
# enqueue-once script (stream/enqueue.lua; docs/wire-format.md, "Enqueue once"). Run it twice with
# the same key: the second run adds nothing and prints the first job's entry ID and job ID.
set -euo pipefail
cli=(redis-cli -h "${REDIS_HOST:-127.0.0.1}" -p "${REDIS_PORT:-6379}")
stream="${PELICAN_STREAM:-jobs}"            # a name without a {hash tag}
script="${PELICAN_ENQUEUE_LUA:-../../stream/enqueue.lua}"
key=invoice-1042-send
job_id=$(cat /proc/sys/kernel/random/uuid)

# KEYS: the stream, then the marker {<stream>}:once:<key>.
# ARGV: MAXLEN (0: none), window in ms (24 h), 1 job: its marker's index in KEYS (2), its job ID,
# the number of values that follow (8), the entry's fields.
# Prints the entry ID, the job ID, and 0 (added) or 1 (a duplicate: those are the first job's).
"${cli[@]}" --eval "$script" "$stream" "{$stream}:once:$key" , \
  0 86400000 1 \
  2 "$job_id" 8 type invoice.send payload '{"invoice_id":1042}' job_id "$job_id" idempotency_key "$key"
