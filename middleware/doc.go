// Package middleware holds the policies that sit between the consumer and the
// user's handler: exclusion and deduplication ([Lock], [Idempotency]),
// failure handling ([Retry], [DeadLetter], [Timeout]) and overload protection
// ([Concurrency], [DistributedConcurrency], [RateLimit], [CircuitBreaker]).
//
//	producer → stream → consumer → middleware (this package) → handler
//
// Every constructor has one shape: required dependencies as arguments and one
// XxxConfig struct, returning a [consumer.Middleware]. Each one works with a
// plain [consumer.HandlerFunc] and needs no Redis to be tested.
//
// Construction: constructors return a Middleware, never an error, so that
// consumer.New(...).Use(...) stays one expression. [RetryConfig],
// [DeadLetterConfig] and [CircuitBreakerConfig] have a Validate method that
// names the first bad field, and [Retry], [DeadLetter] and [CircuitBreaker]
// given an invalid Config return [consumer.Invalid] with that error, which
// makes consumer.Consumer.Run fail before it touches Redis. ([Lock],
// [Idempotency], [DistributedConcurrency] and [RateLimit] still panic on an
// invalid Config, documented there as a programmer error; moving them to the
// same rule is left to their owners.)
//
// # Outcome flow
//
// A handler, and every middleware, returns nil or an error; the error decides
// the outcome. The decision is made in one place per concern, and the consumer
// core applies the final outcome in one atomic script (acknowledge, schedule
// the next attempt, or dead-letter), after checking that it still owns the
// entry:
//
//   - The handler returns nil, a plain error, an error marked with
//     [consumer.Permanent], [consumer.Retryable] or [consumer.RetryAfter], or
//     an outcome it chose itself ([consumer.Retry], [consumer.Snooze],
//     [consumer.Dead]).
//   - [Retry] classifies every error that is not yet an outcome (a user
//     function, the marks, a Retryable() bool method, timeouts, payload
//     decode errors, then a configurable default) into a dead letter (reason
//     "permanent") or a retry: with the RetryAfter delay capped, the backoff
//     of the job's type (RetryConfig.PerType, a [consumer.Backoff]), or else
//     the consumer's Config.Backoff. The attempt limit is the consumer's: it
//     turns a retry of the last attempt into a dead letter with reason
//     "exhausted". Outcomes made by others, panics (the consumer recovers
//     them, by its Config.Panic) and errors returned after the consumer took
//     the job back (shutdown, lease lost) pass through untouched.
//   - What the consumer then does is [consumer.Decide]'s, the one place the
//     rules live. Middleware that needs the outcome (Idempotency, the
//     breaker, tracing and metrics) calls it over what its next handler
//     returned, and reports what the consumer does.
//   - [DeadLetter] dead-letters jobs older than a maximum age, reason
//     "expired", without running them. How dead jobs are recorded, whoever
//     decides that they die (the handler, Retry, the consumer for a malformed
//     or crashed entry), is the consumer's: Config.RedactDeadLetter replaces
//     fields of the dead-letter copy, Config.OnDeadLetter alerts after the
//     write.
//   - [Idempotency], outside Retry, observes its decision: a job that dies
//     with reason "permanent" fails the operation's record for good (later
//     jobs of the key die at once without running, until the record is
//     forgotten); every other outcome, deaths with reason "exhausted",
//     "panic" or "expired" included, releases it, so that a dead-letter
//     replay after a fix runs the job again.
//   - [Timeout] cancels the job's context with cause [ErrJobTimeout], which
//     Retry tells apart from the consumer's own cancellations.
//   - Overload middleware (concurrency limits, rate limits, circuit breakers)
//     return [consumer.Snooze]: the job is rescheduled without counting an
//     attempt, since it did not fail, it did not start. Retry passes a snooze
//     through untouched.
//
// Where dead jobs go and how many are kept is the consumer's
// Config.DeadLetterStream and Config.DeadLetterMaxLen: entries trimmed from a
// bounded dead-letter stream are logged and counted (Stats.DeadTrimmed), never
// dropped silently. Each dead-letter entry holds the job's raw fields (with
// the redactions), its error history (the last five errors) and
// first_failed_at, and dead_reason, dead_error, dead_at, dead_attempts,
// dead_consumer, dead_entry_id and dead_stream.
//
// # Order
//
// The first middleware given to [consumer.Consumer.Use] is the outermost. The
// recommended chain is
//
//	c.Use(tracing,
//		middleware.Lock(rdb, lockCfg),
//		middleware.Idempotency(store, idemCfg),
//		middleware.Retry(retryCfg),
//		middleware.DeadLetter(deadCfg),
//		overload...,                    // concurrency, rate limit, breaker
//		middleware.Timeout(timeoutCfg),
//	)
//
// Tracing is outermost so that its span covers everything, final outcome
// included. The lock and idempotency checks come before any policy, so that a
// job that must not run now is snoozed or skipped before it uses an attempt.
// Retry sits outside everything that can fail, so that every error (the
// handler's, a timeout) reaches its classification, and outside
// DeadLetter, whose expiry decision it passes through as an outcome.
// Overload middleware come next, so their
// snoozes do not count attempts. Timeout is innermost, inside Retry so that
// its timeouts are classified (retryable) and inside overload protection so
// that the time spent waiting for a slot is not counted against the handler,
// while a breaker still sees timeouts as failures. A test (order_test.go)
// records the entry and exit order of this chain on a real consumer.
//
// # Keys: one namespace per queue
//
// [Lock], [Idempotency], [RateLimit] and [DistributedConcurrency] keep their
// keys in the namespace of the job's queue by default, derived from the
// job's stream by stream.KeysFor and sharing its hash tag, as the
// dead-letter and delayed keys do. For queue "orders":
//
//	{orders}:lock:{<key>}   locks (one key each, fence included)
//	{orders}:idem:<key>     idempotency records (with a Redis store)
//	{orders}:rate:<key>     rate limits
//	{orders}:limit:<key>    distributed concurrency limits
//
// and for a stream "{shop}:orders", "{shop}:orders:lock:{<key>}" and so on.
// So one middleware value, or one configuration, reused by two teams' queues
// never lets a key of one queue act on the other: an "invoice-1" completed
// in queue payments does not make queue orders skip its own "invoice-1",
// their locks do not exclude each other, and each queue has its own rate
// and concurrency budgets. Every key of a queue lives in its stream's
// cluster slot, and one Redis ACL per team covers all of it
// ("~orders ~{orders}:*").
//
// Sharing across queues is explicit: set the Prefix of the middleware's
// configuration (LockConfig.Prefix, IdempotencyConfig.Prefix,
// RateLimitConfig.Prefix, DistributedConcurrencyConfig.Prefix), and every
// queue whose middleware has the same Prefix shares those keys (one budget
// for a downstream API several queues call, one record per business
// operation whichever queue it came through). Without a Prefix, a job must
// carry its stream (the consumer sets job.Stream); a handler called outside
// a consumer fails with an error naming job.Stream.
//
// The package imports consumer and stream; consumer never imports it.
package middleware
