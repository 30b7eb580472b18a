// Package lockx is a small distributed lock on Redis, with fencing tokens.
//
//	producer → stream → consumer → middleware (Lock) → handler
//	                                     └── lockx (this package)
//
// A lock is one Redis key holding its fencing token and a random holder
// token ("<fence> <token>"), set with a TTL only if no holder has it:
// whoever holds the token holds the lock until the TTL runs out.
// [Lock.Release] releases the key only if it still holds the caller's
// token (compare-and-release), and [Lock.Extend] resets its TTL only then,
// so a holder whose lock expired can never release or extend the lock of
// the next holder. [Lock.KeepAlive] has the lock extended every TTL/3 while
// it is held, by one watchdog per redis client that renews every lock kept
// alive (and every idempotency lease of idem.RedisStore) in one round trip
// per tick, and closes [Lock.Lost] when it finds the lock gone (or could
// not reach Redis for a whole TTL); [Lock.Guard] gives work a context
// cancelled then. The commands of concurrent callers on one redis client go
// to Redis together: one script call per cluster slot, one round trip.
//
// # Fencing
//
// Every acquisition computes the lock's fencing token ([Lock.Fence]) in the
// same script as the take: the larger of Redis's clock (TIME, in
// microseconds) and one more than the fence the key still holds. Release
// leaves the fence behind (a tombstone: the key holds the fence alone) for
// the lock's TTL. So nothing is kept forever, and the exact guarantee is:
//
//   - While a key holds a fence (its lock is held, or was released less than
//     a TTL ago), the next fence of the key is larger: this holds whatever
//     Redis's clock does.
//   - After the key is gone (the tombstone or an unreleased lock expired),
//     the next fence is Redis TIME, which exceeds every earlier fence of the
//     key unless Redis's clock has gone back by more than the lock's TTL
//     since (a key expires when the clock passes its TTL, by the same clock,
//     and an earlier fence is at most the TIME of its acquisition, plus one
//     per acquisition of that key within one microsecond). The same holds
//     after Redis lost the key (a restart without persistence, a failover to
//     a replica that lacked it, an RDB restore), on any server whose clock
//     is not behind the time of the earlier acquisitions: better than a
//     counter, which a restore would roll back.
//
// The limit: a step of Redis's clock back by more than a lock's TTL (a
// badly set clock, a failover to a server whose clock is behind) can give a
// fence lower than one already given. Fences are about 1.7e15 today and stay
// exact (below 2^53) until the year 2255.
//
// This matters because a lock with a TTL cannot by itself guarantee mutual
// exclusion: a holder that stalls (a GC pause, SIGSTOP, a slow network) past
// its TTL still believes it holds the lock when it wakes up, while another
// process has taken it. Renewal narrows that window but cannot close it,
// since the stalled holder learns of the loss only after it runs again.
// Used on its own, lockx is therefore an efficiency lock: it makes
// concurrent work on one key rare, not impossible. It becomes a correctness
// lock only if the resource it protects checks the fencing token: pass
// Fence with every write and have the store refuse a write whose token is
// lower than the highest it has accepted for the key (a conditional UPDATE,
// a compare-and-set, a Lua check).
//
// # Keys and Redis Cluster
//
// The lock of key k is Config.Prefix + "{" + k + "}", one key, so every
// operation touches one slot and works on Redis Cluster. Without a hash tag
// in the prefix (the default, "pelican:lock:"), the braces around k are the
// tag: each lock hashes by its key, and locks spread over the cluster. With
// a hash tag in the prefix ("{orders}:lock:", the default of
// middleware.Lock: one namespace per queue), the prefix's tag decides the
// slot of every lock of the Client. An empty key is refused with
// [ErrInvalidKey], before Redis is asked. A released lock's key stays for
// the lock's TTL (holding its fence), then expires.
//
// Redis replication is asynchronous: a failover can lose a lock that was
// just taken. Fencing tokens then still grow as long as the new primary's
// clock is not behind (see above); where that matters, the store should
// also reject what it cannot order.
//
// The package depends on go-redis only; it knows nothing of the consumer.
// The middleware package adapts it ([github.com/pelicanqueue/pelican/middleware.Lock]).
package lockx
