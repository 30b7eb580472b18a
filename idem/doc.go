// Package idem records the outcome of business operations, named by their
// idempotency key, so that a job delivered twice, or enqueued twice under
// different job IDs, has its effect once.
//
//	producer → stream → consumer → middleware (Idempotency) → handler
//	                                        ↘ idem.Store
//
// A [Store] holds one record per key. [Store.Begin] either starts the
// operation, creating a processing record with an owner token and a lease,
// or reports what an earlier delivery left: completed (with its stored
// result), failed (with its reason) or in progress (another owner's lease is
// running). The owner then completes ([Store.Complete]), fails
// ([Store.Fail]) or releases ([Store.Release]) the record; each of those
// checks, atomically, that the caller still owns it and returns
// [ErrNotOwner] otherwise.
//
// A failed record is a verdict: the operation can never succeed, and later
// deliveries of the key are not run (the middleware dead-letters them).
// middleware.Idempotency fails a record only on such a verdict (a job that
// dies with reason permanent); a failure that a later run may not have (a
// transient error, even one that exhausted the job's attempts, a panic, an
// expiry) releases the record, so that a dead-letter replay after a fix runs
// the operation again. [Store.Forget] deletes a finished record on an operator's
// request, compare-and-delete on its status: a failed one to run the
// operation again after all (pelican dlq replay --forget-failed-idempotency),
// a completed one to run it a second time on purpose.
//
// Invariants every Store keeps (the conformance suite in idem/idemtest
// checks them; a third-party Store runs it too):
//   - At most one owner holds a key's processing record at a time: of many
//     concurrent Begins for a free key exactly one returns StatusStarted.
//   - A processing record whose lease has passed is free: the next Begin
//     takes it over under a new owner, so a crashed worker never wedges a
//     key. The stale owner's Complete, Fail and Release then fail with
//     [ErrNotOwner].
//   - Completed and failed records are kept for the store's retention and
//     then forgotten: a delivery after that runs again. Choose a retention
//     longer than the retry horizon ([RetryHorizon], [ValidateRetention]).
//   - Forget deletes only a finished record with the status asked for,
//     never a processing one, and reports whether it deleted one.
//   - Complete and Fail by the owner that already completed (failed) the
//     record succeed without changing it, so a handler that completed inside
//     its own transaction ([SQLStore.CompleteTx]) and a middleware that
//     completes afterwards agree.
//
// Two stores ship: [RedisStore] (one short string per key; each operation
// atomic on its one key, the operations of concurrent callers batched in one
// script call per cluster slot, so it works on Redis Cluster; leases renewed
// while the middleware's handler runs) and [SQLStore] (one table
// with the key as primary key, PostgreSQL SQL over database/sql). Only the
// SQL store can commit the completion in the same transaction as the
// business write ([SQLStore.CompleteTx]): for database side effects that is
// exactly one effect, even when a worker dies between the write and the
// acknowledgement. With any other effect the guarantee is one effect per
// completed record, at least once per key: an effect made by a worker that
// dies before Complete is repeated by the next owner.
//
// Keys: a store keeps each record under the key it is given, and adds
// nothing to it (RedisStore's Redis key is the key itself). Who shares a
// record is decided by whoever names the key: middleware.Idempotency names
// it after the job's queue by default ("{orders}:idem:invoice-1"), so two
// queues never share records, and shares them across queues only under an
// explicit IdempotencyConfig.Prefix.
//
// The package is a leaf: it imports go-redis and database/sql, never
// consumer, stream or middleware. The middleware package adapts it
// (middleware.Idempotency).
package idem
