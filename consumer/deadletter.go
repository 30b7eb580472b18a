package consumer

import (
	"context"

	"github.com/pelicanqueue/pelican/stream"
)

// DeadLetter describes a job as it is dead-lettered.
type DeadLetter struct {
	// Job is the decoded job; nil for an entry that did not decode.
	Job *stream.Job
	// EntryID is the source entry's ID.
	EntryID string
	// Stream is the source stream.
	Stream string
	// DeadLetterStream is where the entry goes.
	DeadLetterStream string
	// Reason is the dead_reason, such as [ReasonExhausted].
	Reason string
	// Error is the dead_error text.
	Error string
	// Attempts is the number of attempts made.
	Attempts int
	// DeadEntryID is the dead-letter entry's ID, set once it is written
	// (in [DeadLetterRecorder.Recorded]).
	DeadEntryID string
}

// DeadLetterRecorder decides how one job is recorded if it ends in the
// dead-letter stream, whoever decides that it does (the handler, the retry
// middleware, the consumer). A middleware sets it for the job with
// [SetDeadLetterRecorder]; the consumer calls it when it settles the job.
type DeadLetterRecorder interface {
	// Replace returns field values that replace the entry's own in the
	// dead-letter copy (to redact a payload, say), or nil. It runs before
	// the atomic settlement script and must not block.
	Replace(d DeadLetter) map[string]string
	// Recorded is called after the dead-letter entry was written, with
	// d.DeadEntryID set: for alerting. ctx is the job's context.
	Recorded(ctx context.Context, d DeadLetter)
}

type jobKey struct{}

// SetDeadLetterRecorder sets the recorder of the job whose handler context
// is ctx, replacing any set before, and reports whether ctx is a job's
// context of a Consumer (false in a plain test context).
func SetDeadLetterRecorder(ctx context.Context, r DeadLetterRecorder) bool {
	t, ok := ctx.Value(jobKey{}).(*task)
	if !ok {
		return false
	}
	t.recorder.Store(&r)
	return true
}

func recorderOf(ctx context.Context) DeadLetterRecorder {
	if ctx == nil {
		return nil
	}
	t, ok := ctx.Value(jobKey{}).(*task)
	if !ok {
		return nil
	}
	if r := t.recorder.Load(); r != nil {
		return *r
	}
	return nil
}
