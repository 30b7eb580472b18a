// Package lockx is a small distributed lock on Redis, with fencing tokens.
//
//	producer → stream → consumer → middleware (Lock) → handler
//	                                     └── lockx (this package)
//
// A lock is a key holding a random token, set with SET NX PX: whoever holds
// the token holds the lock until the TTL runs out. [Lock.Release] deletes
// the key only if it still holds the caller's token (compare-and-delete),
// and [Lock.Extend] resets its TTL only then (compare-and-pexpire), so a
// holder whose lock expired can never delete or extend the lock of the next
// holder. [Lock.KeepAlive] extends the lock every TTL/3 while it is held and
// closes [Lock.Lost] when it finds the lock gone (or could not reach Redis
// for a whole TTL).
//
// # Fencing
//
// Every acquisition increments a counter of the key in the same script as
// the SET NX, and the new value is the lock's fencing token ([Lock.Fence]):
// it grows with every acquisition of the key, across expiries, restarts and
// processes. This matters because a lock with a TTL cannot by itself
// guarantee mutual exclusion: a holder that stalls (a GC pause, SIGSTOP, a
// slow network) past its TTL still believes it holds the lock when it wakes
// up, while another process has taken it. Renewal narrows that window but
// cannot close it, since the stalled holder learns of the loss only after
// it runs again. Used on its own, lockx is therefore an efficiency lock: it
// makes concurrent work on one key rare, not impossible. It becomes a
// correctness lock only if the resource it protects checks the fencing
// token: pass Fence with every write and have the store refuse a write
// whose token is lower than the highest it has accepted for the key (a
// conditional UPDATE, a compare-and-set, a Lua check).
//
// # Keys and Redis Cluster
//
// The lock of key k is Config.Prefix + "{" + k + "}" and its fencing counter
// the same followed by ":fence". Both share their hash tag (the text from
// the first '{' to the next '}'), so each script touches one slot and works
// on Redis Cluster. Without a hash tag in the prefix (the default,
// "pelican:lock:"), the braces around k are the tag: each lock hashes by its
// key, and locks spread over the cluster. With a hash tag in the prefix
// ("{orders}:lock:", the default of middleware.Lock: one namespace per
// queue), the prefix's tag decides the slot of every lock of the Client;
// the braces around k then only delimit it, so that no key can name another
// key's fencing counter (the lock "k:fence" is "{orders}:lock:{k:fence}",
// the counter of "k" is "{orders}:lock:{k}:fence"). Keys that would give the
// lock and its counter different slots (an empty key; under a prefix
// without a tag, a key starting with '}') are refused with [ErrInvalidKey],
// before Redis is asked. The fencing counter has no TTL, so that tokens
// never go back: it is one small key per lock key ever used.
//
// Redis replication is asynchronous: a failover can lose a lock that was
// just taken. Fencing tokens stay safe only if the counter is not rolled
// back with it; where that matters, the store should also reject what it
// cannot order.
//
// The package depends on go-redis only; it knows nothing of the consumer.
// The middleware package adapts it ([github.com/pelicanqueue/pelican/middleware.Lock]).
package lockx
