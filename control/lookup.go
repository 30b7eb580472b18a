package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// States that [Lookup] reports in [JobInfo].State: the index record's
// (stream.StateWaiting ... stream.StateCancelling), and these two.
const (
	// StateRunning: the job's entry is pending in a consumer group, a
	// consumer holds it.
	StateRunning = "running"
	// StateUnknown: no record of the job (never tracked, never enqueued,
	// or finished longer ago than consumer.Config.TrackTTL), or a record
	// whose entry is gone from the stream without being settled (trimmed
	// by MaxLen or XTRIM, or deleted): JobInfo.EntryID then names it.
	StateUnknown = "unknown"
)

// MaxJobIDBytes is the longest job ID Lookup accepts: the longest a
// producer tracks ([stream.MaxTrackedIDBytes]).
const MaxJobIDBytes = stream.MaxTrackedIDBytes

// JobInfo says where a tracked job is now.
type JobInfo struct {
	// ID is the job's ID.
	ID string
	// State is one of stream.StateWaiting, stream.StateScheduled,
	// stream.StateRetrying, stream.StateDead, stream.StateDone,
	// stream.StateCancelled, stream.StateCancelling (running, its cancel
	// requested: Group, Consumer, Idle and Deliveries say where),
	// [StateRunning] or [StateUnknown].
	State string
	// EntryID is the stream entry of a waiting, running or cancelling job.
	EntryID string
	// Due is when a scheduled or retrying job is due (Redis clock).
	Due time.Time
	// At is when a done, dead or cancelled job was finished, or when the
	// cancel of a cancelling one was requested (Redis clock).
	At time.Time
	// Error is the last error of a retrying job, or "<reason>: <error>" of
	// a dead-lettered one.
	Error string
	// Result is what the handler of a done job recorded
	// (consumer.SetResult), nil for none.
	Result []byte
	// Group, Consumer, Idle and Deliveries describe a running job: the
	// consumer group and consumer holding it, how long since its last
	// delivery or heartbeat, and how many times it was delivered.
	Group, Consumer string
	Idle            time.Duration
	Deliveries      int64
}

// Lookup says where the tracked job jobID of the queue whose stream is
// named stream is now (see stream.Job.Track), from its index record and,
// for a job waiting in the stream, the entry's pending state in each
// consumer group. It reads a few keys, never scans the stream. A job
// without a record is [StateUnknown], with a nil error; an error means
// Redis could not be read or the record is not one Pelican wrote.
func Lookup(ctx context.Context, rdb redis.UniversalClient, streamName, jobID string) (JobInfo, error) {
	keys, err := stream.KeysFor(streamName)
	if err != nil {
		return JobInfo{}, fmt.Errorf("control: %w", err)
	}
	if jobID == "" || len(jobID) > MaxJobIDBytes {
		return JobInfo{}, fmt.Errorf("control: job ID must be 1 to %d bytes, got %d", MaxJobIDBytes, len(jobID))
	}
	key := stream.JobKey(keys, jobID)
	// The record may change while the entry's pending state is read (the
	// job finishes, is promoted): derive again until the record held still.
	for try := 0; ; try++ {
		v, err := rdb.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			return JobInfo{ID: jobID, State: StateUnknown}, nil
		}
		if err != nil {
			return JobInfo{}, fmt.Errorf("control: look up job: %w", err)
		}
		info, err := derive(ctx, rdb, streamName, jobID, v)
		if err != nil {
			return JobInfo{}, err
		}
		if info.State != stream.StateWaiting && info.State != StateRunning && info.State != StateUnknown && info.State != stream.StateCancelling {
			return info, nil // read from the record alone
		}
		again, err := rdb.Get(ctx, key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return JobInfo{}, fmt.Errorf("control: look up job: %w", err)
		}
		if again == v || try == 4 {
			return info, nil
		}
	}
}

// derive turns record v into a JobInfo, reading a waiting job's entry.
func derive(ctx context.Context, rdb redis.UniversalClient, streamName, jobID, v string) (JobInfo, error) {
	r, err := stream.ParseRecord(v)
	if err != nil {
		return JobInfo{}, fmt.Errorf("control: job %s: %w", clip(jobID), err)
	}
	info := JobInfo{ID: jobID, State: r.State, EntryID: r.Entry, Due: r.Due, At: r.At, Error: r.Error, Result: r.Result}
	if r.State != stream.StateWaiting && r.State != stream.StateCancelling {
		return info, nil
	}
	groups, err := rdb.XInfoGroups(ctx, streamName).Result()
	if err != nil && !isNoStream(err) {
		return JobInfo{}, fmt.Errorf("control: look up job: %w", err)
	}
	for _, g := range groups {
		p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: streamName, Group: g.Name, Start: r.Entry, End: r.Entry, Count: 1}).Result()
		if err != nil {
			return JobInfo{}, fmt.Errorf("control: look up job: %w", err)
		}
		if len(p) == 1 {
			info.Group, info.Consumer, info.Idle, info.Deliveries = g.Name, p[0].Consumer, p[0].Idle, p[0].RetryCount
			if r.State == stream.StateWaiting {
				info.State = StateRunning
			}
			return info, nil
		}
	}
	e, err := rdb.XRange(ctx, streamName, r.Entry, r.Entry).Result()
	if err != nil {
		return JobInfo{}, fmt.Errorf("control: look up job: %w", err)
	}
	if len(e) == 0 {
		info.State = StateUnknown // trimmed or deleted, never settled
	}
	return info, nil
}

func isNoStream(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "ERR no such key")
}

// clip bounds an ID for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q… (%d bytes)", s[:64], len(s))
	}
	return fmt.Sprintf("%q", s)
}
