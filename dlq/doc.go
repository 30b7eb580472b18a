// Package dlq operates a queue's dead-letter stream: it lists, filters,
// inspects, replays and purges dead jobs. It is the operator's end of the
// pipeline, and the API under the CLI.
//
//	producer → stream → consumer → middleware → handler
//	              ↑        ↓ dead-letter (consumer/dead.lua)
//	              └─ dlq (this package): Replay ← dead-letter stream
//
// A [DLQ] is bound to one source stream and its dead-letter stream
// (stream.KeysFor(source).Dead unless configured), which must share the
// source's Redis Cluster slot. [DLQ.List], [DLQ.Get] and [DLQ.Count] read
// with XRANGE and never write. A [Filter] selects entries by job type,
// dead_reason, dead_at range, dead_error text or entry ID.
//
// [DLQ.Replay] puts matching jobs back on the source stream. Invariants:
//
//   - Each entry moves in one script (move.lua): it checks that the replay
//     still holds the lease and that the entry is still in the dead-letter
//     stream, then XADDs the job to the source stream and XDELs the
//     dead-letter entry. A crash at any point neither loses nor doubles a
//     job: an entry is either still dead or replayed once.
//   - The replayed job is the entry's raw fields without the dead_* fields
//     and without attempt (so it starts again at attempt 0). It keeps job_id
//     and idempotency_key (a job that had no job_id gets its first entry's
//     ID, and one without created_at that entry's time, as a retry would)
//     and gains replayed_from (the dead-letter entry ID) and replay_count. Its history (last_error, error_history,
//     first_failed_at) is kept. See move.lua.
//   - One replay per dead-letter stream at a time: a replay holds a lease (a
//     key with a random token, SET NX PX, renewed every LeaseTTL/3); a second
//     Replay gets [ErrReplayActive]. A replay whose lease expired or was
//     taken stops at its next entry with [ErrLeaseLost]: every move checks
//     the token.
//   - A replay is resumable: it records in a cursor hash the filter, the last
//     dead-letter ID it examined and the ID where it ends (the stream's last
//     entry when it started, so jobs that die again during the replay are not
//     replayed in a loop). A Replay with the same filter after a crash or a
//     cancellation continues from the cursor instead of rescanning; one that
//     reaches its end deletes the cursor.
//   - Rate limiting is a schedule computed in Go: the n-th move starts no
//     earlier than start + n/Rate.
//   - ReplayOptions.BeforeMove runs before each move, never after: what it
//     prepares (the CLI forgets the job's failed idempotency record) is done
//     before the replayed job can run. If it fails, the entry stays dead.
//
// Idempotency records: a replayed job keeps its idempotency_key, so it meets
// the record its operation left (middleware.Idempotency). A job that died
// exhausted, by a panic or expired left none (the middleware released it) and
// runs again; one whose operation completed under another job of the key is
// acknowledged without running; one that died with reason permanent left a
// failed record and dies again at once, with the same reason, unless the
// record is forgotten first (BeforeMove, idem.Store.Forget). This package
// does not know the store: the caller decides.
//
// A partitioned queue (stream.Partitions) has a dead-letter stream per
// partition; [Partitioned] operates them as one: List, Count, Purge and
// Replay in one order (by entry ID, equal IDs in partition order), a limit
// over the whole queue, List positions "<entry ID>@<partition>", Get and
// FindJob in whichever partition holds the entry. Its Replay is the same
// code as a DLQ's (a DLQ is the one-stream case): it holds every
// partition's lease and cursor, and deletes the cursors only when it
// reaches the end of every partition.
//
// Keys: the lease is stream.DerivedKey(dead-letter stream, "replay") and
// the cursor stream.DerivedKey(dead-letter stream, "replay:cursor"), so every
// script's keys share one slot.
//
// Permissions: before it takes its lease, a Replay asks Redis (Redis 7) whether
// the client's user may send every command a replay sends, and fails naming
// those it may not (see docs/acl.md): a move whose XDEL is denied after its
// XADD would double the job.
//
// This package imports stream, go-redis and internal helpers only; nothing
// imports it but the CLI and applications.
package dlq
