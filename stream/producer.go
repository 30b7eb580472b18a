package stream

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/refusal"
)

// ProducerConfig configures a [Producer].
type ProducerConfig struct {
	// EnqueueOnce, when positive, makes the producer add a job that has an
	// IdempotencyKey at most once within this window: Enqueue, EnqueueBatch,
	// EnqueueAt and EnqueueIn add the job and set a marker
	// ([Keys].Once + key) in one script, and while the marker lives, a job
	// with the same key adds nothing and gets the first job's IDs (see
	// [Producer]). For a scheduled job the window starts at its due time.
	// Jobs without an IdempotencyKey are added as usual. It must be at least
	// a millisecond. Defaults to 0 (every call adds its job).
	EnqueueOnce time.Duration
	// OnceKey, with EnqueueOnce, returns the key a job is enqueued once by
	// (its marker is [Keys].Once + the key); a job for which it returns ""
	// is added as usual. Package outbox uses it to add each outbox row once.
	// Defaults to the job's IdempotencyKey.
	OnceKey func(job *Job) string
	// OnceNamespace names the namespace of the markers within the queue's:
	// a marker is the queue's prefix + ":" + OnceNamespace + ":" + key
	// ({orders}:once:<key> for queue orders by default). Producers of
	// different namespaces never see each other's markers, whatever their
	// keys: package outbox uses "relayed", so that no idempotency key can
	// suppress a relayed job. It must be letters, digits, '-' or '_', and
	// none of the queue's other key names (dlq, delayed, crashes, idem,
	// lock, rate, limit, periodic, paused, control, job). Defaults to "once".
	OnceNamespace string
	// MaxLen, when positive, trims the stream to about MaxLen entries on every
	// XADD (XADD MAXLEN ~). Redis trims by count and does not look at consumer
	// groups: an entry that is still unread or pending is removed all the same,
	// and a removed pending job is lost (the consumer reports it as lost).
	// Leave it zero and call [TrimAcked] periodically unless losing old jobs
	// under a backlog is acceptable. Defaults to 0 (no trimming).
	MaxLen int64
	// Prepare, when set, is called with each job just before it is encoded,
	// with the context of the Enqueue call: tracing sets the job's W3C trace
	// context here (see package middleware/tracing). Defaults to nil.
	Prepare func(ctx context.Context, job *Job)
	// Stream is the stream jobs are added to. Required.
	Stream string
	// Track sets [Job].Track on every job the producer adds, so that
	// control.Lookup finds it and control.Cancel can cancel it. A tracked
	// job costs one more write per state change (enqueue, promotion,
	// retry, completion), in the scripts that make the change, and its
	// record lives for the consumer's Config.TrackTTL once it is finished;
	// a tracked job is added by the enqueue script instead of a plain XADD,
	// in the same pipeline (see [Producer.EnqueueBatch]). Defaults to false
	// (jobs are tracked only if Job.Track is set).
	Track bool
}

// Producer adds jobs to one stream.
//
// An XADD whose reply was lost (a timeout, a dropped connection) may still
// have been applied: its outcome is unknown, and go-redis itself retries such
// commands. Enqueue then returns an error that says "(outcome unknown)"
// although the job may be in the stream: it means "maybe enqueued". An
// error reply that Redis gives before the write runs (OOM under maxmemory,
// NOPERM, WRONGTYPE, READONLY, ...) says "(not enqueued)" instead: Redis
// refused the last attempt, which wrote nothing. It is exact when go-redis
// made one attempt; after a lost reply go-redis sends the command again
// (redis.Options.MaxRetries, 3 by default), and an earlier attempt may have
// added the job before the retry was refused: with MaxRetries -1 on the
// producer's client, "(not enqueued)" always means not in the stream. Both
// wrap the go-redis error, for errors.Is/As.
//
// Without [ProducerConfig].EnqueueOnce, enqueueing again (or go-redis's own
// retry) may then add the job twice; give jobs an IdempotencyKey so that
// the duplicate has no second effect. With EnqueueOnce, a job with an
// IdempotencyKey is added at most once within the window, whoever sends it
// and however often: a repeated enqueue, a retry after a lost reply or
// another producer's, adds nothing, sets job.ID to the first job's ID and
// returns the first job's entry ID ("" when the first was scheduled), with
// a nil error. Retrying an Enqueue that failed is then safe, and a caller
// that set job.ID tells a duplicate from its own job by comparing it.
type Producer struct {
	rdb redis.UniversalClient
	cfg ProducerConfig
	// once is the prefix of the producer's enqueue-once markers.
	onceAt string
	// err is what Validate said of cfg; every call returns it.
	err error

	mu  sync.Mutex
	rnd *bufio.Reader // crypto/rand, buffered: one read serves many job IDs

	// loaded is set once Redis has run the enqueue script for this
	// producer: its batches then send EVALSHA.
	loaded atomic.Bool
}

// Validate reports the first field of c that is not valid, naming it.
func (c ProducerConfig) Validate() error {
	if _, err := KeysFor(c.Stream); err != nil {
		return fmt.Errorf("stream: ProducerConfig.Stream: %w", err)
	}
	if c.MaxLen < 0 {
		return fmt.Errorf("stream: ProducerConfig.MaxLen (%d) must not be negative", c.MaxLen)
	}
	if c.EnqueueOnce != 0 && c.EnqueueOnce < time.Millisecond {
		return fmt.Errorf("stream: ProducerConfig.EnqueueOnce (%v) must be 0 or at least 1ms", c.EnqueueOnce)
	}
	if !validOnceNamespace(c.onceNamespace()) {
		return fmt.Errorf("stream: ProducerConfig.OnceNamespace (%q) must be letters, digits, '-' or '_', and not a name the queue's other keys use", c.OnceNamespace)
	}
	return nil
}

func (c ProducerConfig) onceNamespace() string {
	if c.OnceNamespace == "" {
		return "once"
	}
	return c.OnceNamespace
}

// NewProducer returns a producer for cfg.Stream. It does not fail: when
// cfg does not pass [ProducerConfig.Validate], every call of the producer
// returns that error, naming the field, before Redis is touched (as
// consumer.Consumer.Run does for its Config). Call Validate to check a
// configuration at start.
func NewProducer(rdb redis.UniversalClient, cfg ProducerConfig) *Producer {
	p := &Producer{rdb: rdb, cfg: cfg, rnd: bufio.NewReaderSize(rand.Reader, 4096)}
	if p.err = cfg.Validate(); p.err == nil {
		p.onceAt, _ = DerivedKey(cfg.Stream, cfg.onceNamespace()+":")
	}
	return p
}

// Enqueue adds job to the stream and returns the new entry's ID. It sets
// job.ID to a new UUIDv7 when it is empty. See [Producer] for what an error
// means.
func (p *Producer) Enqueue(ctx context.Context, job *Job) (string, error) {
	args := new(redis.XAddArgs)
	if _, err := p.args(ctx, job, args, nil); err != nil {
		return "", err
	}
	if p.scripted(job) {
		ids, err := p.send(ctx, []*Job{job}, []*redis.XAddArgs{args})
		return ids[0], err
	}
	id, err := p.rdb.XAdd(ctx, args).Result()
	if err != nil && refusal.Command(err) {
		return "", fmt.Errorf("stream: enqueue %s job %s (not enqueued): %w", job.Type, job.ID, err)
	}
	if err != nil {
		return "", fmt.Errorf("stream: enqueue %s job %s (outcome unknown): %w", job.Type, job.ID, err)
	}
	return id, nil
}

// EnqueueBatch adds jobs in one round trip (a pipeline) and returns their
// entry IDs in order. A job that was not added has an empty ID, and the
// returned error joins the per-job errors; as with Enqueue, a job with an
// error may have been added all the same. A plain job is one XADD; a
// tracked job, and with [ProducerConfig].EnqueueOnce a job with a key, is
// added by the enqueue script, up to [OnceBatch] consecutive such jobs per
// script, pipelined beside the XADDs in the batch's order (a second round
// trip only when Redis lost its script cache, a restart: the scripts then
// come after the batch's XADDs). A duplicate (of an
// earlier job, or of a job earlier in the batch) gets the first job's IDs
// as in [Producer.Enqueue].
func (p *Producer) EnqueueBatch(ctx context.Context, jobs []*Job) ([]string, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	// One array of arguments and one of field values for the whole batch,
	// not two allocations per job (go-redis copies the values it sends).
	all := make([]*redis.XAddArgs, len(jobs))
	args := make([]redis.XAddArgs, len(jobs))
	size := 0
	for _, j := range jobs {
		if j != nil {
			size += encodedCap(j)
		}
	}
	values := make([]any, 0, size)
	for i, j := range jobs {
		var err error
		if values, err = p.args(ctx, j, &args[i], values); err != nil {
			return nil, fmt.Errorf("stream: batch job %d: %w", i, err)
		}
		all[i] = &args[i]
	}
	return p.send(ctx, jobs, all)
}

// scripted reports whether job is added by the enqueue script (see
// EnqueueBatch) rather than by a plain XADD.
func (p *Producer) scripted(job *Job) bool { return job.Track || p.once(job) }

// args checks job, gives it an ID, runs ProducerConfig.Prepare, and sets
// *dst to its XADD: its fields are appended to values (a batch's shared
// array), which it returns extended.
func (p *Producer) args(ctx context.Context, job *Job, dst *redis.XAddArgs, values []any) ([]any, error) {
	if p.err != nil {
		return values, p.err
	}
	if job == nil || job.Type == "" {
		return values, errors.New("stream: job has no Type")
	}
	if err := p.ensureID(job); err != nil {
		return values, err
	}
	if p.cfg.Track {
		job.Track = true
	}
	if job.Track && len(job.ID) > MaxTrackedIDBytes {
		return values, fmt.Errorf("stream: a tracked job's ID must be at most %d bytes (MaxTrackedIDBytes), got %d", MaxTrackedIDBytes, len(job.ID))
	}
	if p.cfg.Prepare != nil {
		p.cfg.Prepare(ctx, job)
	}
	start := len(values)
	values = AppendEncode(values, job)
	*dst = redis.XAddArgs{
		Stream: p.cfg.Stream,
		MaxLen: p.cfg.MaxLen,
		Approx: p.cfg.MaxLen > 0,
		Values: values[start:len(values):len(values)],
	}
	return values, nil
}

// validOnceNamespace reports whether ns may name enqueue-once markers (see
// ProducerConfig.OnceNamespace).
func validOnceNamespace(ns string) bool {
	switch ns {
	case "dlq", "delayed", "crashes", "idem", "lock", "rate", "limit", "periodic", "paused", "control", "job":
		return false
	}
	for _, r := range ns {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return ns != ""
}

// ensureID sets job.ID to a new UUIDv7 when it is empty.
func (p *Producer) ensureID(job *Job) error {
	if job.ID != "" {
		return nil
	}
	p.mu.Lock()
	id, err := uuid.NewV7FromReader(p.rnd)
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("stream: new job ID: %w", err)
	}
	job.ID = id.String()
	return nil
}
