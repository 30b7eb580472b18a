package guard

import (
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
// held in the Op itself (one allocation an operation).
type Op struct {
	key   [2]string
	argv  [7]any
	nkeys int
	nargs int
	slot  int
	grows bool // a take: first in its call (Send)
}

// Slot returns the cluster slot of the operation's keys.
func (o *Op) Slot() int { return o.slot }

func (o *Op) keys() []string { return o.key[:o.nkeys] }
func (o *Op) args() []any    { return o.argv[:o.nargs] }

func newOp(code string, keys []string, args ...any) *Op {
	o := &Op{nkeys: len(keys), nargs: 1 + len(args), slot: keyslot.Of(keys[0])}
	o.grows = code == "la" || code == "rb" || code == "gb"
	copy(o.key[:], keys)
	o.argv[0] = code
	copy(o.argv[1:], args)
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
	return newOp("la", []string{lock}, token, ms(ttl))
}

// LockRelease leaves a tombstone of the fence for keep if lock holds value;
// reply: 1 or 0.
func LockRelease(lock, value string, keep time.Duration) *Op {
	return newOp("lr", []string{lock}, value, ms(keep))
}

// LockExtend sets lock's TTL if it holds value; reply: 1 or 0.
func LockExtend(lock, value string, ttl time.Duration) *Op {
	return newOp("le", []string{lock}, value, ms(ttl))
}

// LockTTL returns lock's PTTL in ms if it holds value, else -3.
func LockTTL(lock, value string) *Op { return newOp("lt", []string{lock}, value) }

// RecordBegin begins record for owner; reply: {status, owner, payload, ""}.
func RecordBegin(record, owner string, lease time.Duration) *Op {
	return newOp("rb", []string{record}, owner, ms(lease))
}

// RecordFinish completes (status "c") or fails ("f") owner's processing
// record with val, kept for retention; reply: 1 or 0.
func RecordFinish(record, owner, status string, val []byte, retention time.Duration) *Op {
	return newOp("rf", []string{record}, owner, status, val, ms(retention))
}

// RecordRelease deletes owner's processing record; reply: 1 or 0.
func RecordRelease(record, owner string) *Op { return newOp("rr", []string{record}, owner) }

// RecordExtend sets the lease of owner's processing record; reply: 1 or 0.
func RecordExtend(record, owner string, lease time.Duration) *Op {
	return newOp("re", []string{record}, owner, ms(lease))
}

// RecordForget deletes a finished record of status ("c" or "f"); reply: 1, 0.
func RecordForget(record, status string) *Op { return newOp("rx", []string{record}, status) }

// LockBegin takes lock and begins record in one step (both in one slot);
// reply: {status, owner, payload, fence} with status "locked" when the lock
// is held.
func LockBegin(lock, token string, ttl time.Duration, record, owner string, lease time.Duration) *Op {
	return newOp("gb", []string{lock, record}, token, ms(ttl), owner, ms(lease))
}

// FinishRelease finishes (status "c", "f") or releases ("r") owner's record,
// then releases lock (value, tombstone kept for keep); reply: {record reply,
// lock reply}.
func FinishRelease(lock, value string, keep time.Duration, record, status, owner string, val []byte, retention time.Duration) *Op {
	return newOp("gf", []string{lock, record}, value, ms(keep), status, owner, val, ms(retention))
}

// SameSlot reports whether keys a and b share a cluster slot.
func SameSlot(a, b string) bool { return keyslot.Of(a) == keyslot.Of(b) }

// Hooks of package lockx, set by its init, through which package
// middleware's fused operations make and release a *lockx.Lock.
var (
	// AdoptLock returns a *lockx.Lock held with fence and token on
	// redisKey (the lock of key), acquired for ttl by a command sent at
	// sent.
	AdoptLock func(r *Runner, key, redisKey, token, fence string, ttl time.Duration, sent time.Time) any
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
	// BeginOutcome returns the idem.Outcome of a begin reply ({status,
	// owner, payload, fence}), and the fence of a fused one.
	BeginOutcome func(reply any) (outcome any, fence string, err error)
)
