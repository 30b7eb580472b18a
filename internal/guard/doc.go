// Package guard is the Redis side of locks (package lockx) and idempotency
// records (idem.RedisStore): one Lua script (ops.lua) that applies a batch
// of lock and record operations, a [Runner] per Redis client that sends the
// operations of concurrent callers together, and a watchdog in the Runner
// that renews every held lease of the client in one round trip per tick.
//
// Batching: a caller that finds no call in flight sends at once, alone or
// with whatever queued meanwhile; callers that arrive while a call is in
// flight queue, and the first of them sends the next call as soon as the
// reply comes back (group commit: no goroutine, no timer, no added latency
// for a lone caller). [Runner.Post] queues an operation nobody waits for
// (a release): it goes with the next call, sent by the caller then leading
// or by a goroutine when none is. Operations are grouped by cluster slot:
// one script call per slot, all calls of a batch in one pipeline; in a call
// the operations that take come before the others, so that over maxmemory
// they are refused while those that finish or release still write, and a
// take of a key that another operation of the batch has goes in a second
// call after it. Per-queue namespaces
// ("{orders}:lock:", "{orders}:idem:") put every operation of a queue in
// one slot, hence one script call per batch.
//
// Fused operations take a lock and begin a record (or finish a record and
// release a lock) in one step; both keys must share a slot.
//
// It imports go-redis only; lockx, idem and middleware build on it.
package guard
