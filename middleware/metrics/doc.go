// Package metrics exports Pelican's job and queue metrics to Prometheus
// (github.com/prometheus/client_golang).
//
//	producer → stream → consumer → middleware (Metrics, outermost) → … → handler
//	                       ↑
//	        Collector: reads queue state from Redis on scrape (cached)
//
// Two parts, used together or alone:
//
//   - [Metrics] counts what handlers decide: its [Metrics.Middleware] sits
//     outermost in the chain (first in consumer.Consumer.Use, next to tracing),
//     so that it sees the final decision of every other middleware (Retry,
//     DeadLetter, Lock, Idempotency, overload). Its hooks plug into
//     middleware.LockConfig.OnConflict ([Metrics.LockConflict]) and
//     middleware.IdempotencyConfig.OnHit ([Metrics.IdempotencyHit]);
//     [Metrics.LockLost] is a second, inner middleware that counts jobs whose
//     lock was lost while they ran.
//   - [NewCollector] reads each queue's state from Redis when Prometheus
//     scrapes (stream length, pending entries, group lag, age of the oldest
//     pending entry, delayed and dead-letter sizes) in one pipelined round
//     trip, cached for CollectorConfig.CacheFor so that frequent or
//     concurrent scrapes never hammer Redis, and exports the counters of
//     running consumers (reclaimed, lost, stale settlements…).
//
// # Names and labels
//
// Every name starts with the namespace ("pelican" by default); counters end
// in _total, durations are in seconds. Labels are bounded: stream, group,
// job type (at most Config.MaxTypes distinct values, then "other"), outcome
// and dead-letter reason. Job IDs, idempotency keys and lock keys are never
// labels.
//
// # What the middleware can and cannot see
//
// The outcome label is the decision the chain returned, mapped as the
// consumer core maps it (see [Outcome]). The core may still fail to apply
// it (the job was reclaimed by another consumer meanwhile, Redis was
// unreachable): those are counted by the consumer (Stats.Stale, exported by
// the collector as pelican_stale_settlements_total), not here. Entries the
// core dead-letters without running them (malformed entries, entries
// that crashed their worker MaxCrashes times) never reach the middleware; they are in pelican_settled_total{outcome="dead_letter"}
// and in the dead-letter stream's length.
//
// # Import direction
//
// The outcome label is the consumer's own decision (consumer.Decide over
// what the chain returned), never derived here; the attempt limit is the
// job's (job.AttemptLimit, filled in by the consumer).
//
// Construction: [New] and [NewCollector] return their value. New panics
// only on a programmer error documented there (a second registration of
// the same metrics); a CollectorConfig that CollectorConfig.Validate
// rejects makes every Gather fail with the error naming the field.
// Config.Validate reports a bad field ahead.
//
// metrics imports consumer, stream and lockx. No core package imports it:
// Prometheus stays out of stream, consumer, claim, lockx and idem
// (internal/depcheck checks it).
package metrics
