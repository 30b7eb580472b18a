// Enqueue two Pelican jobs with ioredis (wire format v1, docs/wire-format.md).
const crypto = require("node:crypto");
const Redis = require("ioredis");

const redis = new Redis({
  host: process.env.REDIS_HOST || "127.0.0.1",
  port: Number(process.env.REDIS_PORT || 6379),
});
const stream = process.env.PELICAN_STREAM || "jobs";

async function main() {
  // (a) The smallest valid job: a type and a payload. Every other field takes its default.
  console.log(await redis.xadd(stream, "*",
    "type", "email.send",
    "payload", JSON.stringify({ to: "a@example.com" })));

  // (b) A job with every optional field a producer writes.
  console.log(await redis.xadd(stream, "*",
    "v", "1",
    "type", "invoice.send",
    "payload", JSON.stringify({ invoice_id: 1042, email: "ann@example.com" }),
    "content_type", "application/json",
    "job_id", crypto.randomUUID(), // any unique string; the Go producer uses a UUIDv7
    "idempotency_key", "invoice-1042-send",
    "attempt", "0",
    "max_attempts", "5",
    "created_at", String(Date.now()), // Unix milliseconds
    "lock_key", "invoice:1042",
    "traceparent", `00-${crypto.randomBytes(16).toString("hex")}-${crypto.randomBytes(8).toString("hex")}-01`,
    "tracestate", "rojo=00f067aa0ba902b7",
    "h.tenant", "acme",
    "origin", "billing-cron"));
}

main()
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(() => redis.disconnect());
