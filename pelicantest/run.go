package pelicantest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// Outcome is how a job's delivery settled.
type Outcome string

// Outcomes of [Run].
const (
	// Done: the job was acknowledged.
	Done Outcome = "done"
	// Retried: the job was rescheduled for another attempt (its attempt
	// count incremented).
	Retried Outcome = "retried"
	// Snoozed: the job was rescheduled without counting an attempt.
	Snoozed Outcome = "snoozed"
	// Dead: the job was moved to the dead-letter stream.
	Dead Outcome = "dead"
)

// Result is what [Run] saw.
type Result struct {
	// Outcome is how the delivery settled, as read back from Redis.
	Outcome Outcome
	// Err is what the middleware chain returned to the consumer (nil for
	// done), before the consumer applied it.
	Err error
	// Job is the job as the chain received it.
	Job *stream.Job
	// Next is the rescheduled job of a retry or snooze, as it will be
	// delivered next (its Attempt, LastError, ErrorHistory); nil otherwise.
	Next *stream.Job
	// Due is when Next falls due, by the Redis clock; zero when it was
	// added to the stream at once (no delay).
	Due time.Time
	// Delay is the delay of a retry or snooze: the one the chain gave
	// (consumer.Retry, consumer.Snooze, consumer.RetryAfter) when it gave
	// one, otherwise measured from Due (a backoff's jittered delay), up to
	// the few milliseconds the settlement took.
	Delay time.Duration
	// Reason and DeadError are the dead letter's dead_reason and
	// dead_error.
	Reason, DeadError string
	// Enqueued are the jobs added to a stream while the job ran (by the
	// handler or its middleware), oldest first, with Stream set; the job's
	// own rescheduled entry is not among them.
	Enqueued []*stream.Job
	// Scheduled are the jobs put in a delayed set while the job ran
	// (EnqueueIn, EnqueueAt), with Stream set; the job's own retry is not
	// among them.
	Scheduled []Scheduled
}

// Scheduled is a job waiting in a delayed set.
type Scheduled struct {
	Job *stream.Job
	// Due is when it is due, by the Redis clock.
	Due time.Time
}

// Option configures [Run].
type Option func(*runConfig)

type runConfig struct {
	redis   *Redis
	cfg     consumer.Config
	mws     []consumer.Middleware
	timeout time.Duration
}

// RunBlock is the default Config.Block of Run's consumer. The embedded
// Redis cannot end a blocked read (CLIENT UNBLOCK), so Run's shutdown waits
// for the read in progress: at the consumer's default of a second, every
// Run on it would take a second.
const RunBlock = 20 * time.Millisecond

// WithRedis runs the job on r (default: a [NewRedis] of the test's own).
func WithRedis(r *Redis) Option { return func(c *runConfig) { c.redis = r } }

// WithConfig sets the consumer's configuration. Stream defaults to
// Redis.Name("jobs"), Group to "pelicantest", Concurrency to 1, Block to
// [RunBlock], Logger to one that discards; the rest to the consumer's
// defaults.
func WithConfig(cfg consumer.Config) Option { return func(c *runConfig) { c.cfg = cfg } }

// WithMiddleware sets the middleware chain, outermost first, as
// consumer.Consumer.Use takes it.
func WithMiddleware(mw ...consumer.Middleware) Option {
	return func(c *runConfig) { c.mws = append(c.mws, mw...) }
}

// WithTimeout bounds how long Run waits for the job to settle (default 30s).
func WithTimeout(d time.Duration) Option { return func(c *runConfig) { c.timeout = d } }

// Run enqueues job on the stream of the consumer's configuration, runs a
// consumer with the middleware chain and handler h until that delivery has
// settled, shuts the consumer down and returns what happened. Only that
// one delivery runs: a job the handler enqueues on the same stream, or the
// job's own retry without delay, is read but held until shutdown and stays
// in the stream (in Result.Enqueued for the former). Run fails the test
// when the job does not settle within the timeout, or the consumer fails.
func Run(t TB, h consumer.Handler, job *stream.Job, opts ...Option) Result {
	t.Helper()
	rc := runConfig{timeout: 30 * time.Second}
	for _, o := range opts {
		o(&rc)
	}
	if rc.timeout <= 0 {
		rc.timeout = 30 * time.Second
	}
	r := rc.redis
	if r == nil {
		r = NewRedis(t)
	}
	cfg := rc.cfg
	if cfg.Stream == "" {
		cfg.Stream = r.Name("jobs")
	}
	if cfg.Group == "" {
		cfg.Group = "pelicantest"
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Block == 0 {
		cfg.Block = RunBlock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	res, err := run(r, h, job, cfg, rc)
	if err != nil {
		t.Fatalf("pelicantest: Run: %v", err)
	}
	return res
}

// gate lets the first delivery through the chain and records it; later
// ones wait for shutdown (and are given back, unsettled).
type gate struct {
	once    sync.Once
	ran     chan struct{} // closed when the first delivery's chain returned
	job     *stream.Job
	err     error
	entryID string
}

func (g *gate) middleware(next consumer.Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
		first := false
		g.once.Do(func() { first = true })
		if !first {
			<-ctx.Done()
			return context.Cause(ctx)
		}
		seen := *job
		g.job, g.entryID = &seen, job.EntryID
		defer close(g.ran) // after a panic too: the consumer recovers it and settles the job
		defer func() {
			if v := recover(); v != nil {
				g.err = &consumer.PanicError{Value: v, Stack: debug.Stack()}
				panic(v)
			}
		}()
		err := next.Process(ctx, job)
		g.err = err
		return err
	})
}

func run(r *Redis, h consumer.Handler, job *stream.Job, cfg consumer.Config, rc runConfig) (Result, error) {
	ctx := context.Background()
	if h == nil || job == nil {
		return Result{}, errors.New("nil handler or job")
	}
	keys, err := stream.KeysFor(cfg.Stream)
	if err != nil {
		return Result{}, fmt.Errorf("Config.Stream: %w", err)
	}
	// The consumer first: a bad configuration fails before anything is
	// written, naming the field.
	g := &gate{ran: make(chan struct{})}
	c := consumer.New(r.Client, cfg).Use(g.middleware).Use(rc.mws...).Handle(h)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	deadline := time.NewTimer(rc.timeout)
	defer deadline.Stop()
	select {
	case <-c.Reading():
	case err := <-runErr:
		return Result{}, fmt.Errorf("the consumer did not start: %v", err)
	case <-deadline.C:
		_ = c.Shutdown(ctx)
		return Result{}, fmt.Errorf("the consumer did not start reading within %v", rc.timeout)
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_ = c.Shutdown(sctx)
		cancel()
		<-runErr
	}
	before, err := r.snapshot(ctx)
	if err != nil {
		stop()
		return Result{}, err
	}
	j := *job
	if _, err := stream.NewProducer(r.Client, stream.ProducerConfig{Stream: cfg.Stream}).Enqueue(ctx, &j); err != nil {
		stop()
		return Result{}, err
	}

	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	settled := func(s consumer.Stats) bool {
		return s.Acked+s.Retried+s.Snoozed+s.DeadLettered+s.Stale > 0
	}
wait:
	for {
		select {
		case err := <-runErr:
			return Result{}, fmt.Errorf("the consumer stopped before the job settled: %v", err)
		case <-deadline.C:
			_ = c.Shutdown(ctx)
			return Result{}, fmt.Errorf("the job did not settle within %v (stats %+v)", rc.timeout, c.Stats())
		case <-tick.C:
			select {
			case <-g.ran:
				if settled(c.Stats()) {
					break wait
				}
			default:
			}
		}
	}
	// Later deliveries wait in the gate: give them back at once.
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_ = c.Shutdown(sctx)
	cancel()
	if err := <-runErr; err != nil {
		return Result{}, fmt.Errorf("consumer: %v", err)
	}
	st := c.Stats()
	res := Result{Err: g.err, Job: g.job}
	switch {
	case st.DeadLettered > 0:
		res.Outcome = Dead
		if err := r.readDead(ctx, keys, cfg, g.entryID, &res); err != nil {
			return res, err
		}
	case st.Retried > 0, st.Snoozed > 0:
		res.Outcome = Retried
		if st.Snoozed > 0 {
			res.Outcome = Snoozed
		}
		if err := r.readNext(ctx, keys, g.entryID, g.job.ID, &res); err != nil {
			return res, err
		}
	case st.Acked > 0:
		res.Outcome = Done
	default:
		return res, fmt.Errorf("the settlement was refused (the consumer no longer owned the entry): stats %+v", st)
	}
	if res.Outcome == Retried || res.Outcome == Snoozed {
		res.Delay = delayOf(g.err, res)
	}
	after, err := r.snapshot(ctx)
	if err != nil {
		return res, err
	}
	res.Enqueued, res.Scheduled, err = r.since(ctx, before, after, keys, j.ID, g.entryID)
	return res, err
}

// delayOf is the delay the chain's error asked for, or the one measured
// from res.Due.
func delayOf(err error, res Result) time.Duration {
	var o *consumer.Outcome
	var ce *consumer.ClassifiedError
	switch {
	case errors.As(err, &o) && !o.IsDead():
		return o.Delay()
	case errors.As(err, &ce) && ce.After > 0 && res.Outcome == Retried:
		return ce.After
	case res.Due.IsZero():
		return 0
	}
	return max(time.Until(res.Due), 0)
}

// readDead fills res from the dead letter of entry id.
func (r *Redis) readDead(ctx context.Context, keys stream.Keys, cfg consumer.Config, id string, res *Result) error {
	dead := cfg.DeadLetterStream
	if dead == "" {
		dead = keys.Dead
	}
	entries, err := r.Client.XRevRangeN(ctx, dead, "+", "-", 100).Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Values["dead_entry_id"] == id {
			res.Reason, _ = e.Values["dead_reason"].(string)
			res.DeadError, _ = e.Values["dead_error"].(string)
			return nil
		}
	}
	return fmt.Errorf("no dead letter of entry %s in %s", id, dead)
}

// readNext fills res.Next and res.Due with the job that entry id was
// rescheduled as: a delayed-set member keyed by id, or a new entry of the
// stream with the job's ID.
func (r *Redis) readNext(ctx context.Context, keys stream.Keys, id, jobID string, res *Result) error {
	members, err := r.Client.ZRangeWithScores(ctx, keys.Delayed, 0, -1).Result()
	if err != nil {
		return err
	}
	for _, m := range members {
		s, _ := m.Member.(string)
		key, fields, err := stream.DecodeDelayed(s)
		if err != nil || key != id {
			continue
		}
		job, err := decodeFields(fields)
		if err != nil {
			return fmt.Errorf("the rescheduled job does not decode: %w", err)
		}
		job.Stream = keys.Stream
		res.Next, res.Due = job, time.UnixMilli(int64(m.Score))
		return nil
	}
	entries, err := r.Client.XRange(ctx, keys.Stream, "("+id, "+").Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Values[stream.FieldJobID] == jobID {
			job, err := stream.Decode(e.ID, e.Values)
			if err != nil {
				return fmt.Errorf("the rescheduled job does not decode: %w", err)
			}
			job.Stream = keys.Stream
			res.Next = job
			return nil
		}
	}
	return errors.New("the rescheduled job is neither in the delayed set nor in the stream")
}

func decodeFields(fields []string) (*stream.Job, error) {
	m := make(map[string]any, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i]] = fields[i+1]
	}
	return stream.Decode("", m)
}

// state is what a test's keys held at one time: each stream's last entry
// ID and each delayed set's members.
type state struct {
	last    map[string]string // stream → last entry ID ("" if empty)
	delayed map[string]map[string]float64
}

func (r *Redis) snapshot(ctx context.Context) (*state, error) {
	queues, err := r.queueKeys(ctx)
	if err != nil {
		return nil, err
	}
	s := &state{last: map[string]string{}, delayed: map[string]map[string]float64{}}
	for k, typ := range queues {
		switch typ {
		case "stream":
			e, err := r.Client.XRevRangeN(ctx, k, "+", "-", 1).Result()
			if err != nil {
				return nil, err
			}
			s.last[k] = ""
			if len(e) > 0 {
				s.last[k] = e[0].ID
			}
		case "zset":
			zs, err := r.Client.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				return nil, err
			}
			m := map[string]float64{}
			for _, z := range zs {
				if s, ok := z.Member.(string); ok {
					m[s] = z.Score
				}
			}
			s.delayed[k] = m
		}
	}
	return s, nil
}

// since returns the jobs added between two snapshots: entries of every
// stream but dead-letter streams, delayed-set members; not the job's own
// entries (jobID) in its stream, nor its own retry (keyed by entryID).
func (r *Redis) since(ctx context.Context, before, after *state, keys stream.Keys, jobID, entryID string) ([]*stream.Job, []Scheduled, error) {
	var enq []*stream.Job
	for k := range after.last {
		if isDeadStream(k) {
			continue
		}
		start := "-"
		if id := before.last[k]; id != "" {
			start = "(" + id
		}
		entries, err := r.Client.XRange(ctx, k, start, "+").Result()
		if err != nil {
			return nil, nil, err
		}
		for _, e := range entries {
			if k == keys.Stream && e.Values[stream.FieldJobID] == jobID {
				continue
			}
			job, err := stream.Decode(e.ID, e.Values)
			if err != nil {
				return nil, nil, fmt.Errorf("entry %s of %s is not a valid job: %w", e.ID, k, err)
			}
			job.Stream = k
			enq = append(enq, job)
		}
	}
	slices.SortFunc(enq, func(a, b *stream.Job) int { return stream.CompareIDs(a.EntryID, b.EntryID) })
	var sch []Scheduled
	for k, members := range after.delayed {
		name := streamOfDelayed(k)
		for m, score := range members {
			if _, ok := before.delayed[k][m]; ok {
				continue
			}
			key, fields, err := stream.DecodeDelayed(m)
			if err != nil {
				return nil, nil, fmt.Errorf("a member of %s does not decode: %w", k, err)
			}
			if k == keys.Delayed && key == entryID {
				continue // the job's own retry
			}
			job, err := decodeFields(fields)
			if err != nil {
				return nil, nil, fmt.Errorf("a member of %s is not a valid job: %w", k, err)
			}
			job.Stream = name
			sch = append(sch, Scheduled{Job: job, Due: time.UnixMilli(int64(score))})
		}
	}
	slices.SortFunc(sch, func(a, b Scheduled) int { return a.Due.Compare(b.Due) })
	return enq, sch, nil
}
