package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [Config].
const (
	DefaultBlock               = time.Second
	DefaultConcurrency         = 10
	DefaultIdleConsumerTimeout = time.Hour
	DefaultMaxAttempts         = 25
	DefaultMaxCrashes          = 3
	DefaultPromoteInterval     = 500 * time.Millisecond
	DefaultSettleTimeout       = 5 * time.Second
	DefaultShutdownTimeout     = 30 * time.Second
	DefaultStartID             = "0"
	DefaultTrackTTL            = stream.DefaultTrackTTL
	DefaultVisibilityTimeout   = 30 * time.Second
)

// Config configures a [Consumer]. Zero values mean the defaults.
type Config struct {
	// Backoff is the delay before the next attempt of a job whose attempt
	// failed without a delay of its own (a plain error, [Retryable], a panic
	// under [PanicRetry]); the retry middleware's per-type entries are
	// Backoffs too, with the same defaults. Defaults to the zero Backoff: 1s
	// doubling per attempt, capped at one hour ([DefaultBackoffCap]), equal
	// jitter.
	Backoff Backoff
	// Block is how long one XREADGROUP waits for new entries. On a
	// single-node client Shutdown ends a blocked read at once (CLIENT
	// UNBLOCK); on a Cluster client, when the Redis user may not run CLIENT
	// ID or CLIENT UNBLOCK, or on a server without them (the embedded
	// miniredis), it waits for the read to return unless the client has
	// ContextTimeoutEnabled. The lease of a job delivered by a blocked read
	// counts from when the read was sent, so keep it short. Defaults to
	// [DefaultBlock].
	Block time.Duration
	// Concurrency is the number of jobs that run at once. Defaults to
	// [DefaultConcurrency].
	Concurrency int
	// Consumer is this consumer's name in the group. It must be unique among
	// the running processes; a process restarted under the same name re-runs
	// its own pending jobs at once instead of after the visibility timeout.
	// Defaults to "<hostname>-<pid>".
	Consumer string
	// DeadLetterStream receives dead-lettered jobs. It must hash to the
	// stream's cluster slot. Defaults to stream.KeysFor(Stream).Dead.
	DeadLetterStream string
	// DeadLetterMaxLen, when positive, bounds the dead-letter stream to this
	// many entries, exactly (MAXLEN =, so that a small bound holds too): each
	// batch of dead letters (one script) trims the oldest beyond it once its
	// entries are added, and the number removed is
	// logged and counted (Stats.DeadTrimmed), never dropped silently.
	// Defaults to 0: unbounded.
	DeadLetterMaxLen int64
	// Group is the consumer group. Required. It is created, with MKSTREAM,
	// when missing.
	Group string
	// HeartbeatInterval is how often the lease of a running job is extended
	// (every half to whole interval). It must be less than half of
	// VisibilityTimeout. Negative disables the heartbeat: every lease then
	// ends VisibilityTimeout after the job's delivery, and its handler's
	// context is cancelled (cause [ErrLeaseLost]) a tenth of it before, so a
	// job must finish within VisibilityTimeout less a tenth; one that does
	// not is run again by the consumer that takes it over, each run counted
	// as a crash, until MaxCrashes. Defaults to VisibilityTimeout/3.
	HeartbeatInterval time.Duration
	// IdleConsumerTimeout: other consumers of the group idle this long with
	// no pending entries are deleted. Negative disables. Defaults to
	// [DefaultIdleConsumerTimeout].
	IdleConsumerTimeout time.Duration
	// KeepSettled keeps settled entries in the stream. By default a
	// consumer deletes the entries it has settled (acknowledged, rescheduled
	// as a new entry, or dead-lettered) once every other group of the stream
	// has read them and holds them no longer: an approximate MINID trim
	// below the oldest entry any group still needs, and XDEL of settled
	// entries once more than about 1,000 of them pile up above it. So the
	// stream holds mostly unsettled work and memory stays flat without any
	// trimming; a long-running job holds its own entry and at most about
	// 1,000 settled ones. Set KeepSettled to keep them (to trim them
	// yourself: stream.TrimAcked, XTRIM). Defaults to false.
	KeepSettled bool
	// Logger receives the consumer's logs. A successful job is logged only at
	// Debug ("job done"), failures at Warn (retry scheduled, lease lost, stale
	// settlement) or Error (dead-lettered, lost), and failed Redis commands at
	// Error at most once per 10s. "job failed; retry scheduled" is logged at
	// most once a second (with suppressed_retries, the number held back
	// since) unless the logger takes Debug: then for every retry. Every record about one job has these
	// attributes, "" or 0 when unknown (an entry that did not decode has no
	// job values but its entry_id): stream, group, consumer, entry_id, job_id,
	// job_type, idempotency_key, attempt (earlier attempts), lock_key,
	// trace_id (from the job's traceparent), duration_ms (the handler's run
	// time), error_kind, and error (the text) when there is one. Payloads and
	// raw entry fields are never logged. error_kind is one of: "" (no error),
	// "retryable", "timeout" (the handler's error is or follows a context
	// deadline, such as MaxRuntime's), "snooze", "shutdown" (given back at
	// shutdown), "lease_lost" (reclaimed by another consumer, lease ended
	// without a heartbeat, or no longer owned when settled), "lost" (deleted
	// or trimmed from the stream), or a dead-letter reason: "malformed",
	// "unknown_type", "crashed",
	// "panic", "exhausted", "permanent" (also for a reason given to [Dead],
	// which the record's dead_reason attribute has). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// MaxAttempts is the number of attempts of a job that keeps failing,
	// unless the job's max_attempts field says otherwise; then it is
	// dead-lettered with reason "exhausted". It is the one setting of the
	// limit: the consumer fills each job's AttemptLimit from it (or from
	// max_attempts), where middleware reads it. Defaults to
	// [DefaultMaxAttempts].
	MaxAttempts int
	// MaxCrashes is how many times a job may be running when its worker
	// stops without settling it (a crash, a kill, running out of memory, a
	// stall or a cut-off past the visibility timeout) before it is
	// dead-lettered with reason "crashed" instead of being run again. Only
	// runs the job can be blamed for count: a job delivered again (its
	// delivery count over 1) is a suspect, and each of its runs is counted
	// in Redis before it starts (the count is cleared when it settles). Its
	// first counted run may be shared with other jobs; every later one runs
	// alone on its consumer (no other job starts there until it is
	// settled). A job that was merely in flight beside one that crashed the
	// worker has at most one count, and settles when it runs alone, so it is
	// never dead-lettered for the other's crashes. At least 2. Defaults to
	// [DefaultMaxCrashes].
	MaxCrashes int
	// MaxEntryBytes is the largest entry accepted; larger ones are
	// dead-lettered as malformed. Defaults to stream.DefaultMaxEntryBytes.
	MaxEntryBytes int
	// MaxRuntime cancels a handler's context after this long. Defaults to 0:
	// no limit.
	MaxRuntime time.Duration
	// OnDeadLetter, if set, is called after a job was written to the
	// dead-letter stream, whoever decided its death (the handler, the retry
	// middleware on the last attempt, the consumer for a malformed or
	// crashed entry), with d.DeadEntryID set: for alerting. ctx carries the
	// job's context values but is not cancelled with it. It runs in the
	// job's worker slot, which waits for the job's batch of dead letters
	// when it is set: keep it short, or hand the work off. Defaults to
	// nil.
	OnDeadLetter func(ctx context.Context, d DeadLetter)
	// Panic is what a handler's panic does to its job. The consumer
	// recovers panics where handlers run (the middleware need not).
	// Defaults to [PanicDeadLetter].
	Panic PanicPolicy
	// Prefetch is how many entries, beyond those its Concurrency workers
	// run, the consumer may hold read but not started, so that it reads in
	// batches and a worker that finishes a job starts the next one at once.
	// An entry held is pending under this consumer like a running job: the
	// heartbeat extends its lease, it is not started (it is left for
	// another consumer to take over) once its lease has ended, and shutdown
	// gives it back without running it. The price is balance: a consumer
	// holds up to Prefetch entries that an idle consumer of the group
	// cannot take, so with long jobs on several consumers a small Prefetch
	// spreads them better; and after a crash every job it held comes back a
	// suspect (see MaxCrashes), so a large Prefetch makes recovery from
	// repeated crashes slower. Negative disables it: each read then takes
	// only as many entries as there are free workers. Defaults to
	// Concurrency, raised while jobs are short (queued jobs would wait a
	// few milliseconds at most) up to what makes Concurrency plus Prefetch
	// 100, so that fast jobs are read in batches of 50 to 100. The room
	// shrinks only at the next read: a burst of jobs that block, read while
	// the room was grown, is held (running or queued, leases kept) until
	// the workers free; set Prefetch to bound that.
	Prefetch int
	// PromoteInterval is how often due jobs move from the delayed set back to
	// the stream. Defaults to [DefaultPromoteInterval].
	PromoteInterval time.Duration
	// RedactDeadLetter, if set, returns field values that replace the job's
	// own in its dead-letter copy, such as {"payload": "<redacted>"},
	// whoever decided its death (as for OnDeadLetter); fields the entry
	// does not have are ignored, and the source entry is left as it is. job
	// is nil for an entry that did not decode (its raw fields are then
	// copied as they are). It must not block. Defaults to nil: the copy
	// holds the raw fields.
	RedactDeadLetter func(job *stream.Job) map[string]string
	// RedactError, when set, rewrites the text of a job's error before
	// Pelican stores it (dead_error, last_error, error_history, the Error
	// of DeadLetter) or logs it, so that a handler error or panic value
	// that quotes the payload ("invalid card %s") does not leak it:
	// field redaction (RedactDeadLetter) cannot reach
	// these texts. job is nil for an entry that did not decode. Texts are
	// bounded to 4 KiB after it. Defaults to nil: texts as they are.
	RedactError func(job *stream.Job, text string) string
	// SettleTimeout bounds each settlement (ack, retry, dead-letter). A
	// settlement that fails leaves the job pending, to be recovered after the
	// visibility timeout. Defaults to [DefaultSettleTimeout].
	SettleTimeout time.Duration
	// ShutdownTimeout is the drain deadline when Run's context is cancelled
	// (Shutdown takes its own deadline from its context). Defaults to
	// [DefaultShutdownTimeout].
	ShutdownTimeout time.Duration
	// StartID is where a new group starts reading: "0" for every entry in the
	// stream, "$" for new entries only. A group lost with its data (Redis
	// restarted without persistence) is recreated from "0". Defaults to
	// [DefaultStartID].
	StartID string
	// StartTimeout bounds how long Run waits at start for Redis to answer
	// (to create the group). While Redis does not answer (not started yet,
	// restarting, loading its data, failing over), Run retries with the
	// backoff it uses during an outage (50ms doubling to 2s, jittered) and
	// logs the error at most once per 10s; cancelling its context or calling
	// Shutdown ends the wait at once, and Run returns nil. When StartTimeout
	// passes, Run returns the last attempt's error, or, when no attempt has
	// answered yet (go-redis may still be retrying its dial), an error
	// saying that Redis did not answer within StartTimeout. Negative: fail
	// fast, Run returns the first error. Errors that waiting cannot fix end the wait at once
	// whatever this says: the replies WRONGTYPE (the stream key holds
	// another type), NOAUTH, WRONGPASS, NOPERM and "unknown command", and a
	// closed client. Defaults to 0: no limit.
	StartTimeout time.Duration
	// Stream is the stream to consume. Required.
	Stream string
	// SweepInterval is how often this consumer looks for jobs idle longer
	// than VisibilityTimeout. A job abandoned by a dead worker starts again
	// within VisibilityTimeout + SweepInterval. Defaults to
	// VisibilityTimeout/2.
	SweepInterval time.Duration
	// TrackTTL is how long the index record of a tracked job (see
	// stream.Job.Track) lives once the job is finished (done,
	// dead-lettered or cancelled), so that control.Lookup still reports
	// it. Defaults to [DefaultTrackTTL] (24 h).
	TrackTTL time.Duration
	// VisibilityTimeout is how long a delivered job may go without a
	// heartbeat before another consumer takes it over: the job's lease. A
	// lease is counted from when the read that delivered the job, or the
	// last successful heartbeat, was sent. A handler whose lease was not
	// extended for VisibilityTimeout less a tenth (Redis unreachable, the
	// process stalled) has its context cancelled with cause [ErrLeaseLost]
	// then, before another consumer can start the job, and is not settled.
	// Defaults to [DefaultVisibilityTimeout].
	VisibilityTimeout time.Duration
}

// resolved is a Config with its defaults applied and validated.
type resolved struct {
	Config
	keys stream.Keys
	pol  policy
	// prefetchMax is the most entries beyond Concurrency the consumer may
	// hold: Prefetch when set, else what fast jobs earn (see roomLimit).
	prefetchMax int
}

// Validate reports whether c is a valid configuration, and if not names the
// first field that is not ("consumer: Config.Group is required"). Run
// checks it before it touches Redis; call it to check a configuration
// earlier.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

func (c Config) resolve() (resolved, error) {
	bad := func(format string, args ...any) (resolved, error) {
		return resolved{}, fmt.Errorf("consumer: "+format, args...)
	}
	if c.Stream == "" {
		return bad("Config.Stream is required")
	}
	keys, err := stream.KeysFor(c.Stream)
	if err != nil {
		return bad("Config.Stream: %v", err)
	}
	if c.Group == "" {
		return bad("Config.Group is required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Block", c.Block}, {"MaxRuntime", c.MaxRuntime},
		{"PromoteInterval", c.PromoteInterval}, {"SettleTimeout", c.SettleTimeout},
		{"ShutdownTimeout", c.ShutdownTimeout}, {"SweepInterval", c.SweepInterval},
		{"TrackTTL", c.TrackTTL}, {"VisibilityTimeout", c.VisibilityTimeout}} {
		if d.v < 0 {
			return bad("Config.%s (%v) must not be negative", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"Concurrency", c.Concurrency}, {"MaxAttempts", c.MaxAttempts},
		{"MaxCrashes", c.MaxCrashes}, {"MaxEntryBytes", c.MaxEntryBytes}} {
		if n.v < 0 {
			return bad("Config.%s (%d) must not be negative", n.name, n.v)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Block, DefaultBlock)
	def(&c.VisibilityTimeout, DefaultVisibilityTimeout)
	def(&c.HeartbeatInterval, c.VisibilityTimeout/3)
	def(&c.SweepInterval, c.VisibilityTimeout/2)
	def(&c.PromoteInterval, DefaultPromoteInterval)
	def(&c.SettleTimeout, DefaultSettleTimeout)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	def(&c.IdleConsumerTimeout, DefaultIdleConsumerTimeout)
	def(&c.TrackTTL, DefaultTrackTTL)
	if c.TrackTTL < time.Millisecond {
		return bad("Config.TrackTTL (%v) must be 0 or at least 1ms", c.TrackTTL)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	prefetchMax := c.Prefetch
	switch {
	case c.Prefetch == 0:
		c.Prefetch = c.Concurrency
		prefetchMax = max(c.Concurrency, fastRoom-c.Concurrency)
	case c.Prefetch < 0:
		c.Prefetch, prefetchMax = 0, 0
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxCrashes == 0 {
		c.MaxCrashes = DefaultMaxCrashes
	}
	if c.MaxCrashes < 2 {
		return bad("Config.MaxCrashes (%d) must be at least 2: a job's first run after a crash may be shared with the job that caused it, so one count cannot be blamed on it alone", c.MaxCrashes)
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = stream.DefaultMaxEntryBytes
	}
	if c.StartID == "" {
		c.StartID = DefaultStartID
	}
	if !validStartID(c.StartID) {
		return bad(`Config.StartID (%q) must be "$" or a stream entry ID such as "0" or "1700000000000-0"`, c.StartID)
	}
	if err := c.Backoff.Validate(); err != nil {
		return bad("Config.%v", err)
	}
	if c.Panic != PanicDeadLetter && c.Panic != PanicRetry {
		return bad("Config.Panic (%d) is not a PanicPolicy", c.Panic)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Consumer == "" {
		host, _ := os.Hostname()
		c.Consumer = host + "-" + strconv.Itoa(os.Getpid())
	}
	if c.DeadLetterStream == "" {
		c.DeadLetterStream = keys.Dead
	}
	if c.DeadLetterMaxLen < 0 {
		return bad("Config.DeadLetterMaxLen (%d) must not be negative", c.DeadLetterMaxLen)
	}
	if c.DeadLetterStream == c.Stream {
		return bad("Config.DeadLetterStream (%q) must differ from Config.Stream", c.DeadLetterStream)
	}
	if keyslot.Of(c.DeadLetterStream) != keyslot.Of(c.Stream) {
		return bad("Config.DeadLetterStream (%q) must hash to the cluster slot of Config.Stream (%q); use a name with the same hash tag, such as %q",
			c.DeadLetterStream, c.Stream, keys.Dead)
	}
	if c.HeartbeatInterval > 0 && c.HeartbeatInterval*2 >= c.VisibilityTimeout {
		return bad("Config.HeartbeatInterval (%v) must be less than half of Config.VisibilityTimeout (%v)",
			c.HeartbeatInterval, c.VisibilityTimeout)
	}
	if c.Block >= c.VisibilityTimeout {
		return bad("Config.Block (%v) must be less than Config.VisibilityTimeout (%v)", c.Block, c.VisibilityTimeout)
	}
	return resolved{Config: c, keys: keys, pol: policy{backoff: c.Backoff, panic: c.Panic, maxAttempts: c.MaxAttempts}, prefetchMax: prefetchMax}, nil
}

// validStartID reports whether id is an ID that XGROUP CREATE accepts: "$",
// "<ms>" or "<ms>-<seq>".
func validStartID(id string) bool {
	if id == "$" {
		return true
	}
	ms, seq, hasSeq := strings.Cut(id, "-")
	if _, err := strconv.ParseUint(ms, 10, 64); err != nil {
		return false
	}
	if hasSeq {
		if _, err := strconv.ParseUint(seq, 10, 64); err != nil {
			return false
		}
	}
	return true
}
