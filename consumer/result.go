package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/pelicanqueue/pelican/stream"
)

// MaxResultBytes is the largest result a handler may record with
// [SetResult].
const MaxResultBytes = 4096

// ErrNoJob is returned by [SetResult] called with a context that is not a
// job's.
var ErrNoJob = errors.New("consumer: not a job's context")

// SetResult records result as the outcome of the job whose handler got
// ctx: when the job is tracked (stream.Job.Track) and is acknowledged, its
// index record keeps result for Config.TrackTTL, and control.Lookup
// returns it. It rides the acknowledgement: nothing is written before.
// A later call replaces an earlier one. A result over [MaxResultBytes] is
// refused with an error, never cut short; a job that is not tracked keeps
// nothing, and SetResult returns nil.
func SetResult(ctx context.Context, result []byte) error {
	t := taskOf(ctx)
	if t == nil {
		return ErrNoJob
	}
	if len(result) > MaxResultBytes {
		return fmt.Errorf("consumer: result of %d bytes is over MaxResultBytes (%d)", len(result), MaxResultBytes)
	}
	s := string(result)
	t.result.Store(&s)
	return nil
}

// ackOf returns the ack item of task t, whose job is job (nil when it did
// not decode) and was done or (cancelled) cancelled: with its index record
// and result when the job is tracked.
func (c *Consumer) ackOf(t *task, job *stream.Job, cancelled bool) ackItem {
	it := ackItem{id: t.id, cancelled: cancelled}
	if job != nil && job.Track && job.ID != "" {
		it.index = stream.JobKey(c.r.keys, job.ID)
		if r := t.result.Load(); r != nil {
			it.result = *r
		}
	}
	return it
}
