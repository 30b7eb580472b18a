package control

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/pelicanqueue/pelican/internal/refusal"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed cancel.lua
	cancelLua    string
	cancelScript = redis.NewScript(cancelLua)
	// cancelRefusals are the error replies cancel.lua gives only before it
	// writes or publishes anything (see its header). Not OOM, READONLY,
	// MISCONF or NOREPLICAS: for a running job the script publishes the
	// cancel message before its only write, which those refuse.
	cancelRefusals = []string{"NOPERM ", "WRONGTYPE ", "ERR cancel.lua:", "BUSY ", "LOADING ", "MASTERDOWN ",
		"MOVED ", "ASK ", "TRYAGAIN ", "CROSSSLOT ", "CLUSTERDOWN ", "NOSCRIPT "}
)

// Errors of [Cancel].
var (
	// ErrUnknownJob: the job has no index record (not tracked, never
	// enqueued, finished longer ago than its record lives), or what the
	// record points to is gone.
	ErrUnknownJob = errors.New("control: unknown job")
	// ErrJobFinished: the job is done, dead-lettered or cancelled already.
	ErrJobFinished = errors.New("control: job already finished")
)

// maxSameDue bounds the delayed-set members cancel.lua reads to find a job:
// those due at the same millisecond as it.
const maxSameDue = 1000

// Cancel cancels the tracked job jobID (see stream.Job.Track) of the queue
// whose stream is named stream, in one script, and returns the state the
// job had:
//
//   - scheduled or retrying: removed from the delayed set;
//   - waiting (in the stream, not delivered to any group): deleted from the
//     stream;
//   - running (pending in a group): returns stream.StateCancelling. The
//     record says cancelling, and the consumer that holds the job is told
//     on the queue's control channel (Keys.Control); within about a second
//     (its check of the records of the tracked jobs it holds, if the
//     message is lost) it cancels the handler's context with cause
//     consumer.ErrCancelled, or settles the job without running it if it
//     has not started; a consumer that reclaims it from a dead one does the
//     same. The job then ends cancelled, or done if its handler completed
//     anyway (returned nil): the record says which. Asked again while the
//     job is cancelling, Cancel returns stream.StateCancelling again and
//     tells the consumer again.
//
// A cancelled job's record says stream.StateCancelled for
// stream.DefaultTrackTTL (consumer.Config.TrackTTL when a consumer settled
// it), so that [Lookup] reports it. A job done, dead or cancelled returns
// [ErrJobFinished], and one without a record [ErrUnknownJob] (wrapped, with
// the state); neither changes anything. An error from Redis says "(nothing
// changed)" when Redis refused the script before it wrote anything, and
// "(outcome unknown)" when the reply was lost (the job may be cancelled:
// [Lookup] says, and asking again is safe); both wrap the go-redis error.
func Cancel(ctx context.Context, rdb redis.UniversalClient, streamName, jobID string) (string, error) {
	keys, err := stream.KeysFor(streamName)
	if err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	if jobID == "" || len(jobID) > MaxJobIDBytes {
		return "", fmt.Errorf("control: job ID must be 1 to %d bytes, got %d", MaxJobIDBytes, len(jobID))
	}
	res, err := cancelScript.Run(ctx, rdb, []string{keys.Stream, keys.Delayed, stream.JobKey(keys, jobID)},
		jobID, stream.DefaultTrackTTL.Milliseconds(), maxSameDue, keys.Control).StringSlice()
	if err != nil && refusal.Script(err, cancelRefusals...) {
		return "", fmt.Errorf("control: cancel job %s (nothing changed): %w", clip(jobID), err)
	}
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
	case len(res) == 3 && res[0] == stream.StateCancelling:
		return stream.StateCancelling, nil
	}
	return "", fmt.Errorf("control: cancel job %s: unexpected reply %q", clip(jobID), res)
}
