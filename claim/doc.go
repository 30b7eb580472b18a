// Package claim implements the visibility timeout of Pelican's consumer
// groups: it recovers the jobs that dead or stalled consumers left pending,
// and lets live consumers keep the jobs they are still running.
//
//	producer → stream → consumer ⇄ claim → middleware → handler
//
// The group's pending-entries list (PEL) is the in-flight store. An entry
// that stays idle longer than the visibility timeout belongs to a consumer
// that stopped making progress; [Claimer.Sweep] takes such entries over with
// XAUTOCLAIM (never JUSTID, so every reclaim counts as a delivery and a job
// that crashes its worker every time can be recognised by its count).
// [Claimer.Extend] is the heartbeat of a running job, and [Claimer.ReadOwn]
// re-reads a restarted consumer's own entries. Every call that changes an
// entry's owner or idle time first checks, in the same script, that the
// caller still owns it: a stale worker cannot take a job back from its new
// owner.
//
// Entries deleted or trimmed while pending have no body and cannot run; the
// claimer removes them from the PEL and returns their IDs so that the caller
// reports them as lost.
//
// An entry over the size limit given to [New] ([Oversize]) is handed over
// cut short, in the script that takes it ([Entry.Cut]): a reply never
// carries it whole, so an entry too large to arrive within the client's
// ReadTimeout cannot fail every sweep that meets it, and those of the
// entries taken with it. An entry larger than the limit only by the
// earlier values of names it gives again (within it as
// stream.DecodeFields counts) is handed over with one value per name, its
// last ([Entry.Fields]). The limit also bounds a reply: the script stops
// taking entries once those it hands over add up to it.
//
// The package depends on go-redis only; the consumer package drives it.
package claim
