package consumer

import "github.com/pelicanqueue/pelican/stream"

// DeadLetter describes a job as it is dead-lettered: what
// [Config.OnDeadLetter] is given.
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
	// (in [Config.OnDeadLetter]).
	DeadEntryID string
}
