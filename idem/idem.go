package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Sentinel errors of the package, matched with errors.Is.
var (
	// ErrNotOwner: the caller no longer owns the key's processing record:
	// its lease passed and another owner took the record over, or the
	// record is gone or finished by someone else.
	ErrNotOwner = errors.New("idem: not the owner of the processing record")
	// ErrFailed is wrapped by the error the middleware returns for a job
	// whose operation failed permanently in an earlier delivery.
	ErrFailed = errors.New("idem: operation failed earlier")
	// ErrInvalid: an argument is out of range (empty key or owner, lease
	// under 1 ms) or a configuration is unusable.
	ErrInvalid = errors.New("idem: invalid argument")
)

// Status is what [Store.Begin] found.
type Status int

const (
	// StatusStarted: the caller now owns a processing record for the key
	// and must run the operation, then Complete, Fail or Release.
	StatusStarted Status = iota
	// StatusCompleted: the operation completed; Outcome.Result holds its
	// stored result.
	StatusCompleted
	// StatusInProgress: another owner's lease on the key is running.
	StatusInProgress
	// StatusFailed: the operation failed permanently (a verdict that no
	// retry can change); Outcome.Reason says why.
	StatusFailed
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case StatusStarted:
		return "started"
	case StatusCompleted:
		return "completed"
	case StatusInProgress:
		return "in_progress"
	case StatusFailed:
		return "failed"
	default:
		return fmt.Sprintf("Status(%d)", int(s))
	}
}

// Outcome is what [Store.Begin] returns.
type Outcome struct {
	// Status is the state of the key's record.
	Status Status
	// Result is the stored result of a completed operation (nil if it was
	// completed with an empty one).
	Result []byte
	// Reason is the reason of a failed operation.
	Reason string
	// Owner is the record's owner: the caller's token when Started, else
	// the owner that holds, completed or failed it.
	Owner string
}

// Store records operations by idempotency key. Implementations are safe for
// concurrent use by many goroutines and processes, and run the conformance
// suite idemtest.Run.
type Store interface {
	// Begin starts the operation of key for owner, with a processing record
	// held for lease, unless a record exists: it then reports it (completed,
	// failed, or in progress under another owner's unexpired lease). An
	// expired processing record is taken over: Begin returns StatusStarted
	// and the previous owner loses it.
	Begin(ctx context.Context, key, owner string, lease time.Duration) (Outcome, error)
	// Complete marks owner's processing record completed with result, kept
	// for the store's retention. It returns ErrNotOwner if owner does not
	// hold the record, and nil without a change if owner already completed
	// it. Whether an owner whose lease passed, but whose record nobody has
	// taken over yet, may still complete is the store's choice: RedisStore
	// refuses (the record expired), SQLStore accepts (the row is still
	// there and owned by the caller).
	Complete(ctx context.Context, key, owner string, result []byte) error
	// Fail marks owner's processing record failed with reason, kept for the
	// store's retention: later Begins return StatusFailed. It returns
	// ErrNotOwner if owner does not hold the record, and nil without a
	// change if owner already failed it.
	Fail(ctx context.Context, key, owner, reason string) error
	// Release deletes owner's processing record, so that the next Begin
	// starts the operation again (after a retryable failure). It returns
	// ErrNotOwner if owner does not hold a processing record for key.
	Release(ctx context.Context, key, owner string) error
	// Forget deletes key's finished record if its status is status
	// (StatusCompleted or StatusFailed), so that the next Begin starts the
	// operation again, and reports whether it deleted one (false: no
	// record, or one with another status). It is the operator's way back
	// from a verdict: forget a failed record to run the operation again
	// after a fix (a dead-letter replay), a completed one to run it a
	// second time on purpose. A processing record is never forgotten: its
	// owner runs the operation, and its lease frees the key if that owner
	// died. The owner of a forgotten record can no longer Complete or Fail
	// it (ErrNotOwner). It returns an error wrapping ErrInvalid for an
	// empty key or any other status.
	Forget(ctx context.Context, key string, status Status) (bool, error)
}

// Claim is a running operation: the key and owner token under which the
// middleware began it, and the store that holds the record. The middleware
// puts it in the handler's context ([ClaimFromContext]).
type Claim struct {
	// Key is the record's key.
	Key string
	// Owner is the owner token of the processing record.
	Owner string
	// Store holds the record.
	Store Store

	mu     sync.Mutex
	result []byte
}

// SetResult sets the result the middleware stores when the handler
// succeeds; later deliveries of the same key find it in Outcome.Result.
func (c *Claim) SetResult(b []byte) {
	c.mu.Lock()
	c.result = append([]byte(nil), b...)
	c.mu.Unlock()
}

// Result returns what SetResult set.
func (c *Claim) Result() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.result
}

type claimKey struct{}

// NewContext returns ctx carrying c.
func NewContext(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// ClaimFromContext returns the Claim of the operation the handler runs
// under, if any. A handler using [SQLStore.CompleteTx] takes the key and
// owner from it.
func ClaimFromContext(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(*Claim)
	return c, ok && c != nil
}

// RetryHorizon returns how long after its first delivery a job can still be
// delivered: maxAttempts times maxBackoff (each retry waits at most that),
// plus replayWindow, the longest a dead-lettered job may wait before it is
// replayed. Records must be kept longer than that, or a late delivery runs
// the operation again.
func RetryHorizon(maxAttempts int, maxBackoff, replayWindow time.Duration) time.Duration {
	return time.Duration(max(maxAttempts, 0))*max(maxBackoff, 0) + max(replayWindow, 0)
}

// ValidateRetention returns an error naming both values unless retention
// exceeds horizon (see [RetryHorizon]).
func ValidateRetention(retention, horizon time.Duration) error {
	if retention <= horizon {
		return fmt.Errorf("%w: retention (%v) must exceed the retry horizon (%v): a job delivered after its record expired would run again",
			ErrInvalid, retention, horizon)
	}
	return nil
}

// checkArgs validates the common arguments of Store methods.
func checkArgs(key, owner string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if owner == "" {
		return fmt.Errorf("%w: empty owner", ErrInvalid)
	}
	return nil
}

// checkForget validates the arguments of Store.Forget.
func checkForget(key string, status Status) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if status != StatusCompleted && status != StatusFailed {
		return fmt.Errorf("%w: cannot forget a %v record, only a completed or failed one", ErrInvalid, status)
	}
	return nil
}

func checkLease(lease time.Duration) error {
	if lease < time.Millisecond {
		return fmt.Errorf("%w: lease (%v) must be at least 1ms", ErrInvalid, lease)
	}
	return nil
}
