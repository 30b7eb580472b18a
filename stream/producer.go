package stream

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// ProducerConfig configures a [Producer].
type ProducerConfig struct {
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
}

// Producer adds jobs to one stream.
//
// An XADD whose reply was lost (a timeout, a dropped connection) may still
// have been applied: its outcome is unknown, and go-redis itself retries such
// commands. Enqueue then returns an error although the job may be in the
// stream, and enqueueing again may add it twice. Give jobs an
// IdempotencyKey so that the duplicate has no second effect, and treat
// every Enqueue error as "maybe enqueued".
type Producer struct {
	rdb redis.UniversalClient
	cfg ProducerConfig

	mu  sync.Mutex
	rnd *bufio.Reader // crypto/rand, buffered: one read serves many job IDs
}

// NewProducer returns a producer for cfg.Stream. It panics if cfg.Stream is
// empty or a name that [KeysFor] rejects, as those are programming errors.
func NewProducer(rdb redis.UniversalClient, cfg ProducerConfig) *Producer {
	if _, err := KeysFor(cfg.Stream); err != nil {
		panic(fmt.Sprintf("stream: ProducerConfig.Stream: %v", err))
	}
	if cfg.MaxLen < 0 {
		panic("stream: ProducerConfig.MaxLen must not be negative")
	}
	return &Producer{rdb: rdb, cfg: cfg, rnd: bufio.NewReaderSize(rand.Reader, 4096)}
}

// Enqueue adds job to the stream and returns the new entry's ID. It sets
// job.ID to a new UUIDv7 when it is empty. See [Producer] for what an error
// means.
func (p *Producer) Enqueue(ctx context.Context, job *Job) (string, error) {
	args, err := p.args(ctx, job)
	if err != nil {
		return "", err
	}
	id, err := p.rdb.XAdd(ctx, args).Result()
	if err != nil {
		return "", fmt.Errorf("stream: enqueue %s job %s (outcome unknown): %w", job.Type, job.ID, err)
	}
	return id, nil
}

// EnqueueBatch adds jobs in one round trip (a pipeline of XADDs) and returns
// their entry IDs in order. A job that was not added has an empty ID, and the
// returned error joins the per-job errors; as with Enqueue, a job with an
// error may have been added all the same.
func (p *Producer) EnqueueBatch(ctx context.Context, jobs []*Job) ([]string, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	all := make([]*redis.XAddArgs, len(jobs))
	for i, j := range jobs {
		args, err := p.args(ctx, j)
		if err != nil {
			return nil, fmt.Errorf("stream: batch job %d: %w", i, err)
		}
		all[i] = args
	}
	cmds := make([]*redis.StringCmd, len(jobs))
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, a := range all {
			cmds[i] = pipe.XAdd(ctx, a)
		}
		return nil
	})
	ids := make([]string, len(jobs))
	var errs []error
	for i, c := range cmds {
		id, err := c.Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("stream: enqueue %s job %s (outcome unknown): %w", jobs[i].Type, jobs[i].ID, err))
			continue
		}
		ids[i] = id
	}
	return ids, errors.Join(errs...)
}

func (p *Producer) args(ctx context.Context, job *Job) (*redis.XAddArgs, error) {
	if job == nil || job.Type == "" {
		return nil, errors.New("stream: job has no Type")
	}
	if job.ID == "" {
		p.mu.Lock()
		id, err := uuid.NewV7FromReader(p.rnd)
		p.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("stream: new job ID: %w", err)
		}
		job.ID = id.String()
	}
	if p.cfg.Prepare != nil {
		p.cfg.Prepare(ctx, job)
	}
	return &redis.XAddArgs{
		Stream: p.cfg.Stream,
		MaxLen: p.cfg.MaxLen,
		Approx: p.cfg.MaxLen > 0,
		Values: Encode(job),
	}, nil
}
