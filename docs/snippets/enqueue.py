"""Enqueue two Pelican jobs with redis-py (wire format v1, docs/wire-format.md)."""
import json
import os
import secrets
import time
import uuid

import redis

r = redis.Redis(
    host=os.environ.get("REDIS_HOST", "127.0.0.1"),
    port=int(os.environ.get("REDIS_PORT", "6379")),
)
stream = os.environ.get("PELICAN_STREAM", "jobs")

# (a) The smallest valid job: a type and a payload. Every other field takes its default.
entry_id = r.xadd(stream, {"type": "email.send", "payload": json.dumps({"to": "a@example.com"})})
print(entry_id.decode())

# (b) A job with every optional field a producer writes.
entry_id = r.xadd(
    stream,
    {
        "v": "1",
        "type": "invoice.send",
        "payload": json.dumps({"invoice_id": 1042, "email": "ann@example.com"}),
        "content_type": "application/json",
        "job_id": str(uuid.uuid4()),  # any unique string; the Go producer uses a UUIDv7
        "idempotency_key": "invoice-1042-send",
        "attempt": "0",
        "max_attempts": "5",
        "created_at": str(time.time_ns() // 1_000_000),  # Unix milliseconds
        "lock_key": "invoice:1042",
        "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01",
        "tracestate": "rojo=00f067aa0ba902b7",
        "h.tenant": "acme",
        "origin": "billing-cron",
    },
)
print(entry_id.decode())
