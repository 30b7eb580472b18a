package stream

import (
	"strconv"
	"time"
)

// Version is the wire-format version this package writes and reads.
const Version = 1

// Field names of wire format v1. A non-Go producer writes these names.
const (
	FieldVersion        = "v"
	FieldType           = "type"
	FieldPayload        = "payload"
	FieldJobID          = "job_id"
	FieldIdempotencyKey = "idempotency_key"
	FieldAttempt        = "attempt"
	FieldMaxAttempts    = "max_attempts"
	FieldCreatedAt      = "created_at"
	FieldLockKey        = "lock_key"
	FieldContentType    = "content_type"
	FieldTraceParent    = "traceparent"
	FieldTraceState     = "tracestate"
	FieldLastError      = "last_error"
	FieldErrorHistory   = "error_history"
	FieldFirstFailedAt  = "first_failed_at"
	FieldSuspect        = "suspect"
	FieldTrack          = "track"
	// HeaderPrefix starts the name of every user header field: h.<name>.
	HeaderPrefix = "h."
)

// Fields a dead-letter replay (package dlq) adds to a replayed job. They are
// not the format's own (a Job holds them in Extra, and retries carry them
// over), but they do not count toward [MaxFields]: a job at the limit can
// be replayed.
const (
	// FieldReplayedFrom is the dead-letter entry ID a replayed job came from.
	FieldReplayedFrom = "replayed_from"
	// FieldReplayCount counts how many times the job was replayed.
	FieldReplayCount = "replay_count"
)

// Content types understood by [Job.Decode] and [NewJob].
const (
	ContentTypeJSON    = "application/json"
	ContentTypeMsgpack = "application/msgpack"
)

// Job is one unit of work: the decoded form of a stream entry.
//
// The fields below Extra are set by the consumer when it delivers the job and
// are never written to the stream.
type Job struct {
	// ID identifies the job across retries. The Go producer sets a UUIDv7
	// when it is empty; a job written without job_id takes the ID of its first
	// stream entry.
	ID string
	// Type routes the job to a handler. Required.
	Type string
	// Payload is the job's body, opaque to Pelican.
	Payload []byte
	// ContentType names Payload's encoding. Empty means application/json on
	// the wire; the Go producer writes application/msgpack for payloads made by
	// [NewJob].
	ContentType string
	// IdempotencyKey names the business operation, so that duplicate
	// deliveries or duplicate enqueues can be recognised.
	IdempotencyKey string
	// Attempt counts the earlier attempts: 0 on the first run.
	Attempt int
	// MaxAttempts caps the attempts of this job; 0 means the consumer's policy.
	MaxAttempts int
	// CreatedAt is when the job was first enqueued. Zero on the wire means the
	// time in the first entry's ID.
	CreatedAt time.Time
	// LockKey names the entity the job must hold a lock on, if any.
	LockKey string
	// TraceParent and TraceState carry W3C trace context.
	TraceParent, TraceState string
	// LastError is the error of the previous attempt, set on retries.
	LastError string
	// ErrorHistory holds the errors of the latest attempts, oldest first
	// (the consumer keeps the last 5), set on retries. On the wire it is a
	// JSON array of strings.
	ErrorHistory []string
	// FirstFailedAt is when the job's first attempt failed, set on retries.
	FirstFailedAt time.Time
	// Suspect is set by the consumer on a job rescheduled after a run that
	// followed a crash of its worker: its next runs are counted as a
	// suspect's (see consumer.Config.MaxCrashes), although it comes back as
	// a new entry. Producers leave it unset.
	Suspect bool
	// Track makes Redis keep the job's index record ([Keys].Job), so
	// that control.Lookup finds where the job is and control.Cancel can
	// cancel it: every script that changes the job's state rewrites the
	// record (one write). On the wire it is "track": "1". Set by
	// [ProducerConfig].Track; retries carry it over.
	Track bool
	// Headers are the user headers (h.<name> fields), without the prefix.
	Headers map[string]string
	// Extra holds the fields this version of the format does not know. They
	// are kept: Encode writes them back, and retries carry them over.
	Extra map[string]string

	// EntryID is the stream entry this delivery came from.
	EntryID string
	// Stream is the stream the job was read from.
	Stream string
	// Group is the consumer group that delivered the job.
	Group string
	// AttemptLimit is the number of attempts the job gets: MaxAttempts
	// when set, else the consumer's Config.MaxAttempts. Observers read the
	// limit here rather than configuring their own.
	AttemptLimit int
	// Deliveries is how many times Redis has delivered this entry, this
	// delivery included (the pending-entries list's delivery count).
	Deliveries int
}

// EntryTime returns the time encoded in a stream entry ID such as
// "1700000000000-0", and false if id is not of that form.
func EntryTime(id string) (time.Time, bool) {
	ms := id
	for i := 0; i < len(id); i++ {
		if id[i] == '-' {
			ms = id[:i]
			break
		}
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
