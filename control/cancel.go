package control

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed cancel.lua
	cancelLua    string
	cancelScript = redis.NewScript(cancelLua)
)

// Errors of [Cancel].
var (
	// ErrUnknownJob: the job has no index record (not tracked, never
	// enqueued, finished longer ago than its record lives), or what the
	// record points to is gone.
	ErrUnknownJob = errors.New("control: unknown job")
	// ErrJobFinished: the job is done, dead-lettered or cancelled already.
	ErrJobFinished = errors.New("control: job already finished")
	// ErrJobRunning: a consumer holds the job. Cancelling a running job is
	// not supported yet.
	ErrJobRunning = errors.New("control: job is running")
)

// maxSameDue bounds the delayed-set members cancel.lua reads to find a job:
// those due at the same millisecond as it.
const maxSameDue = 1000

// Cancel cancels the tracked job jobID (see stream.Job.Track) of the queue
// whose stream is named stream, in one script: a scheduled or retrying job
// is removed from the delayed set, a waiting job (in the stream, not
// delivered to any group) is deleted from the stream, and its record says
// stream.StateCancelled for stream.DefaultTrackTTL, so that [Lookup]
// reports it. It returns the state the job had. A job that is running
// returns [ErrJobRunning], one done, dead or cancelled [ErrJobFinished],
// and one without a record [ErrUnknownJob] (wrapped, with the state); none
// of them changes anything.
func Cancel(ctx context.Context, rdb redis.UniversalClient, streamName, jobID string) (string, error) {
	keys, err := stream.KeysFor(streamName)
	if err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	if jobID == "" || len(jobID) > MaxJobIDBytes {
		return "", fmt.Errorf("control: job ID must be 1 to %d bytes, got %d", MaxJobIDBytes, len(jobID))
	}
	res, err := cancelScript.Run(ctx, rdb, []string{keys.Stream, keys.Delayed, stream.JobKey(keys, jobID)},
		jobID, stream.DefaultTrackTTL.Milliseconds(), maxSameDue).StringSlice()
	if err != nil {
		return "", fmt.Errorf("control: cancel job %s (outcome unknown): %w", clip(jobID), err)
	}
	switch {
	case len(res) == 2 && res[0] == "cancelled":
		return res[1], nil
	case len(res) == 1 && res[0] == "unknown":
		return "", fmt.Errorf("%w %s", ErrUnknownJob, clip(jobID))
	case len(res) == 2 && res[0] == "finished":
		return res[1], fmt.Errorf("%w: job %s is %s", ErrJobFinished, clip(jobID), res[1])
	case len(res) == 3 && res[0] == "running":
		return StateRunning, fmt.Errorf("%w: job %s is held by consumer %s of group %s", ErrJobRunning, clip(jobID), clip(res[2]), clip(res[1]))
	}
	return "", fmt.Errorf("control: cancel job %s: unexpected reply %q", clip(jobID), res)
}
