package guard

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
)

var (
	//go:embed ops.lua
	opsLua    string
	opsScript = redis.NewScript(opsLua)
)

// Op is one operation of ops.lua: its keys (all in one slot) and arguments,
// held in the Op itself (one allocation an operation). Its string and
// []byte arguments are sent by pointer into the Op (go-redis writes a
// *string, and a []byte through its BinaryMarshaler), so that boxing them
// as command arguments allocates nothing; its keys are plain strings, as
// go-redis's cluster routing and its users' hooks read them. An Op is
// given to the Runner once (Do, Settle, Post or Send): its passage through
// the queue is part of it.
type Op struct {
	key   [2]string
	str   [4]string // the string arguments, argv points at them
	val   bytesArg  // the []byte argument, argv points at it
	argv  [7]any
	nkeys int
	nargs int
	nstr  int
	slot  int  // the keys' cluster slot, set by Send on a cluster client
	grows bool // a take: first in its call (Send)
	call  call // its passage through the Runner's queue (Do, Settle, Post)
}

// bytesArg is a []byte command argument that a pointer to it boxes without
// allocating.
type bytesArg []byte

// MarshalBinary implements encoding.BinaryMarshaler, which go-redis writes.
func (b *bytesArg) MarshalBinary() ([]byte, error) { return *b, nil }

func (o *Op) keys() []string { return o.key[:o.nkeys] }
func (o *Op) args() []any    { return o.argv[:o.nargs] }

// newOp returns the operation code on keys (one or two); its arguments
// follow with s, b and a.
func newOp(code string, key0, key1 string) *Op {
	o := &Op{nkeys: 1, nargs: 1}
	o.grows = code == "la" || code == "rb" || code == "gb"
	o.key[0], o.key[1] = key0, key1
	if key1 != "" {
		o.nkeys = 2
	}
	o.argv[0] = code // a constant: boxing it allocates nothing
	return o
}

// s appends the string argument v.
func (o *Op) s(v string) *Op {
	o.str[o.nstr] = v
	o.argv[o.nargs] = &o.str[o.nstr]
	o.nstr++
	o.nargs++
	return o
}

// b appends the []byte argument v.
func (o *Op) b(v []byte) *Op {
	o.val = v
	o.argv[o.nargs] = &o.val
	o.nargs++
	return o
}

// a appends the argument v, boxed already (ms).
func (o *Op) a(v any) *Op {
	o.argv[o.nargs] = v
	o.nargs++
	return o
}

// Ms formats d as whole milliseconds, at least 1.
func Ms(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// msArgs caches ms's arguments: the TTLs, leases and retentions of a
// process are a few values, formatted and boxed once (up to msArgsMax).
var (
	msArgs    sync.Map // time.Duration -> any (string)
	msArgsN   atomic.Int32
	msArgsMax int32 = 64
)

// ms returns Ms(d) as a script argument.
func ms(d time.Duration) any {
	if v, ok := msArgs.Load(d); ok {
		return v
	}
	var v any = Ms(d)
	if msArgsN.Load() < msArgsMax {
		msArgsN.Add(1)
		msArgs.Store(d, v)
	}
	return v
}

// statusArg returns a record status ("c", "f", "r") as a script argument,
// boxed once.
func statusArg(status string) any {
	switch status {
	case "c":
		return "c"
	case "f":
		return "f"
	case "r":
		return "r"
	}
	return status
}

// Token returns a random lock holder token: 128 bits of math/rand/v2's
// ChaCha8, which the runtime seeds from the system once, so a token costs
// no system call (crypto/rand makes one). A token is an owner check, not a
// secret (the lock holds it for anyone who may GET the key to read): it
// needs to be unique among the holders of a key, across processes.
func Token() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// LockValue is what a held lock of fence and token holds.
func LockValue(fence, token string) string { return fence + " " + token }

// LockAcquire takes lock for ttl with token; reply: the fence (string) or 0.
func LockAcquire(lock, token string, ttl time.Duration) *Op {
	return newOp("la", lock, "").s(token).a(ms(ttl))
}

// LockRelease leaves a tombstone of the fence for keep if lock holds value;
// reply: 1 or 0.
func LockRelease(lock, value string, keep time.Duration) *Op {
	return newOp("lr", lock, "").s(value).a(ms(keep))
}

// LockExtend sets lock's TTL if it holds value; reply: 1 or 0.
func LockExtend(lock, value string, ttl time.Duration) *Op {
	return newOp("le", lock, "").s(value).a(ms(ttl))
}

// LockTTL returns lock's PTTL in ms if it holds value, else -3.
func LockTTL(lock, value string) *Op { return newOp("lt", lock, "").s(value) }

// RecordBegin begins record for owner; reply: 1 (started), else the record
// as it is, {status, owner, payload}.
func RecordBegin(record, owner string, lease time.Duration) *Op {
	return newOp("rb", record, "").s(owner).a(ms(lease))
}

// RecordFinish completes (status "c") or fails ("f") owner's processing
// record with val, kept for retention; reply: 1 or 0.
func RecordFinish(record, owner, status string, val []byte, retention time.Duration) *Op {
	return newOp("rf", record, "").s(owner).a(statusArg(status)).b(val).a(ms(retention))
}

// RecordRelease deletes owner's processing record; reply: 1 or 0.
func RecordRelease(record, owner string) *Op { return newOp("rr", record, "").s(owner) }

// RecordExtend sets the lease of owner's processing record; reply: 1 or 0.
func RecordExtend(record, owner string, lease time.Duration) *Op {
	return newOp("re", record, "").s(owner).a(ms(lease))
}

// RecordForget deletes a finished record of status ("c" or "f"); reply: 1, 0.
func RecordForget(record, status string) *Op { return newOp("rx", record, "").a(statusArg(status)) }

// LockBegin takes lock and begins record in one step (both in one slot);
// reply: the fence (string) when both are taken, 0 when the lock is held,
// else the record as it is ({status, owner, payload}, as RecordBegin).
func LockBegin(lock, token string, ttl time.Duration, record, owner string, lease time.Duration) *Op {
	return newOp("gb", lock, record).s(token).a(ms(ttl)).s(owner).a(ms(lease))
}

// FinishRelease finishes (status "c", "f") or releases ("r") owner's record,
// then releases lock (value, tombstone kept for keep); reply: the record's
// reply (1 or 0) + 2 * the lock's (3: both done).
func FinishRelease(lock, value string, keep time.Duration, record, status, owner string, val []byte, retention time.Duration) *Op {
	return newOp("gf", lock, record).s(value).a(ms(keep)).a(statusArg(status)).s(owner).b(val).a(ms(retention))
}

// SameSlot reports whether keys a and b share a cluster slot.
func SameSlot(a, b string) bool { return keyslot.Same(a, b) }

// Hooks of package lockx, set by its init, through which package
// middleware's fused operations make and release a *lockx.Lock.
var (
	// AdoptLock returns a *lockx.Lock held with fence and token on
	// redisKey (the lock of key), acquired for ttl by a command sent at
	// sent.
	AdoptLock func(r *Runner, key, redisKey, token, fence string, ttl time.Duration, sent time.Time) any
	// GuardLock is (*lockx.Lock).Guard returning the context's
	// context.CancelCauseFunc, which others (an idempotency lease) may also
	// call with their cause: one cancellable context for both.
	GuardLock func(ctx context.Context, lock any) (context.Context, context.CancelCauseFunc)
	// TakeRelease stops renewing a *lockx.Lock and marks it released, and
	// returns its Redis key, the value it holds and its TTL (the tombstone's),
	// or ok false if it was released already.
	TakeRelease func(lock any) (redisKey, value string, ttl time.Duration, ok bool)
)

// Hooks of package idem, set by its init, through which package
// middleware fuses a lock with an idem.RedisStore's record.
var (
	// StoreOf returns the Runner and retention of an *idem.RedisStore, or
	// ok false for any other store.
	StoreOf func(store any) (r *Runner, retention time.Duration, ok bool)
	// BeginOutcome returns the idem.Outcome of a begin reply for owner
	// (RecordBegin's, or LockBegin's when the record exists).
	BeginOutcome func(reply any, owner string) (outcome any, err error)
)
