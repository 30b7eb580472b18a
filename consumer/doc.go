// Package consumer runs jobs from a Redis Streams consumer group: it reads,
// dispatches to the handler through the middleware chain, and settles each
// job atomically once its outcome is final.
//
//	producer → stream → consumer (this package) → middleware → handler
//	                        ⇅ claim (visibility timeout)
//
// A Consumer reads with XREADGROUP in batches into a queue that its
// Concurrency workers run from, holding at most Concurrency + Prefetch fresh
// jobs; a queued job keeps its lease like a running one, is not started once
// its lease has ended, and is given back unstarted at shutdown (see
// [Config.Prefetch]). A job is acknowledged only when its
// outcome is final, and each outcome is one Lua script that first checks that
// this consumer still owns the entry in the group's pending-entries list:
//
//   - done: XACK (finished jobs are acknowledged in batches);
//   - retry later: XACK and schedule the next attempt in the delayed set, with
//     attempt incremented and the error recorded;
//   - dead-letter: XACK and XADD to the dead-letter stream with the original
//     raw fields and dead_* metadata.
//
// Each runs once per batch (ack.lua, retry.lua, dead.lua), each entry in it
// owner-checked on its own; a worker queues its job's retry, snooze or dead
// letter and takes its next job (it waits only for a suspect, and to call
// Config.OnDeadLetter), and shutdown runs what is queued.
//
// A worker whose job was reclaimed by another consumer therefore can neither
// acknowledge nor settle it. Delivery is at-least-once: a job whose worker
// died after the side effect and before the acknowledgement runs again, so
// handlers must be idempotent.
//
// A running job holds a lease on its entry: the heartbeat renews it, and a
// handler whose lease could not be renewed in time (Redis unreachable, the
// process stalled, the heartbeat disabled) has its context cancelled with
// cause [ErrLeaseLost] a tenth of the visibility timeout before another
// consumer could take the job over; such a job is not settled here. See
// [Config.VisibilityTimeout].
//
// Handlers return typed outcomes: nil (done), an error made by [Retry],
// [Snooze] or [Dead], or any other error (retried with [Config.Backoff]
// until [Config.MaxAttempts]). A panic is recovered and the job is
// dead-lettered with reason "panic" and the stack. [Decide] holds these
// rules: the consumer settles every job from the [Decision] it returns, and
// middleware that needs the outcome calls it rather than deriving its own.
//
// Construction: [New], [Consumer.Use] and [Consumer.Handle] never fail, so
// that a consumer is built in one expression; [Consumer.Run] checks the
// configuration ([Config.Validate]) and every middleware's (see [Invalid])
// before it touches Redis, and returns the error naming the field. Nothing
// in this package panics on a configuration; [Mux.Handle] panics on a
// programmer error (an empty type, a nil handler, a type registered twice),
// as documented there.
//
// A [Pool] runs several queues (streams) in one process with one shared
// budget of worker slots, by weight or strict priority, each queue between
// its Min and Max: each queue is a Consumer, and the pool decides which
// queue's job starts when a slot frees (see budget.go and docs/pool.md).
//
// Pauses: an operator pauses the queue, or one job type of it, with package
// control. Every consumer subscribes to the queue's control channel once and
// holds what is paused without starting it and without counting an attempt
// or a delivery: no read while the whole queue is paused, read jobs parked
// with their leases extended by the heartbeat, reclaimed jobs held with their
// worker slot, suspects before their run is counted. Held jobs start at once
// on resume and are given back at shutdown. While the queue is paused,
// [Consumer.WaitIdle] does not return (no read finds the stream empty).
//
// The package imports stream, claim and control (a leaf: stream and go-redis
// only), never middleware, and no observability library.
package consumer
