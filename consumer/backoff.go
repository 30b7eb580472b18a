package consumer

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [Backoff]: the consumer's retry policy waits 1s after a first
// failed attempt, doubling per attempt up to one hour, with equal jitter.
const (
	DefaultBackoffBase = time.Second
	DefaultBackoffCap  = time.Hour
)

// Jitter is how [Backoff] randomises a delay, so that jobs that failed
// together do not all retry together.
type Jitter int

const (
	// JitterEqual waits between half and all of the raw delay: [raw/2, raw].
	// It is the zero value, and so the default.
	JitterEqual Jitter = iota
	// JitterFull waits between nothing and the raw delay: [0, raw].
	JitterFull
	// JitterNone waits exactly the raw delay.
	JitterNone
)

// Backoff is an exponential backoff: the raw delay before the retry that
// follows attempt n (0 for the first run) is min(Cap, Base·2ⁿ), randomised
// by Jitter. It is the consumer's retry policy ([Config.Backoff]) and the
// type of the retry middleware's per-type overrides; zero fields mean the
// defaults, the same wherever a Backoff is used.
type Backoff struct {
	// Base is the raw delay after the first attempt. Defaults to
	// [DefaultBackoffBase].
	Base time.Duration
	// Cap bounds the raw delay. Defaults to [DefaultBackoffCap].
	Cap time.Duration
	// Jitter randomises the delay. Defaults to [JitterEqual].
	Jitter Jitter
}

// Validate reports the first field of b that is out of range, named as in
// Go ("Backoff.Cap").
func (b Backoff) Validate() error {
	switch {
	case b.Base < 0:
		return fmt.Errorf("Backoff.Base (%v) must not be negative", b.Base)
	case b.Cap < 0:
		return fmt.Errorf("Backoff.Cap (%v) must not be negative", b.Cap)
	case b.Jitter < JitterEqual || b.Jitter > JitterNone:
		return fmt.Errorf("Backoff.Jitter (%d) is not a Jitter", b.Jitter)
	}
	base, ceil := b.bounds()
	if base > ceil {
		return fmt.Errorf("Backoff.Base (%v) must not exceed Backoff.Cap (%v)", base, ceil)
	}
	return nil
}

// bounds returns b's base and cap with the defaults applied.
func (b Backoff) bounds() (base, ceil time.Duration) {
	base, ceil = b.Base, b.Cap
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if ceil <= 0 {
		ceil = DefaultBackoffCap
	}
	return base, ceil
}

// Raw returns the delay before jitter after attempt earlier attempts:
// min(Cap, Base·2^attempt), without overflow for any attempt. A negative
// attempt counts as 0.
func (b Backoff) Raw(attempt int) time.Duration {
	base, ceil := b.bounds()
	attempt = max(attempt, 0)
	if attempt >= 62 || base > ceil>>uint(attempt) {
		return ceil
	}
	return min(base<<uint(attempt), ceil)
}

// Delay returns the delay before the retry that follows job's current
// attempt (job.Attempt earlier ones): [Backoff.Raw] randomised by b.Jitter.
// The jitter is drawn from a hash of the job's entry ID, ID and attempt, not
// from a random source: jobs that fail together still spread out, and the
// delay of one job's attempt is the same wherever it is computed (the
// consumer that settles it, and every observer that reads [Decide]).
func (b Backoff) Delay(job *stream.Job) time.Duration {
	raw := b.Raw(job.Attempt)
	switch b.Jitter {
	case JitterNone:
		return raw
	case JitterFull:
		return hashUniform(jitterSeed(job), 0, raw)
	default:
		return hashUniform(jitterSeed(job), raw/2, raw)
	}
}

// jitterSeed hashes job's entry ID, ID and attempt (FNV-1a, then the
// splitmix64 finaliser).
func jitterSeed(job *stream.Job) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, s := range [...]string{job.EntryID, job.ID} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h = (h ^ 0xff) * prime // separator: ("ab","c") differs from ("a","bc")
	}
	h ^= uint64(job.Attempt)
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// hashUniform maps the hash h to a duration in [lo, hi].
func hashUniform(h uint64, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	n := uint64(hi-lo) + 1 // no overflow: hi-lo < 2^63
	off, _ := bits.Mul64(h, n)
	return lo + time.Duration(off)
}
