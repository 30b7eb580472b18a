package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/middleware/metrics"
	"github.com/pelicanqueue/pelican/middleware/tracing"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

const pelicanGroup = "g"

// handlerMode is what a Pelican phase's handler does besides counting.
type handlerMode int

const (
	plain      handlerMode = iota
	retryOnce              // consumer.Retry(0, err) on a job's first attempt
	snoozeOnce             // consumer.Snooze(0) on a job's first run
)

// variant is the consumer side of a Pelican phase.
type variant struct {
	conc    int    // Config.Concurrency: 0 is the default Config
	chain   string // "", "mid" or "full": see chain
	mode    handlerMode
	produce bool // jobs produced during the run instead of a backlog
	pool    bool // three streams in one consumer.Pool (pelicanPool)
	track   bool // tracked jobs (ProducerConfig.Track): checkTracked
}

var errOnce = errors.New("bench: fails once")

// pelicanFill enqueues jobs 0..n-1 with Producer.EnqueueBatch in batches
// of 100.
func (b *bench) pelicanFill(ctx context.Context, s string, n int) {
	b.pelicanFillRange(ctx, s, 0, n, false)
}

// pelicanFillRange enqueues jobs from..to-1 as pelicanFill does, tracked
// (ProducerConfig.Track) if track.
func (b *bench) pelicanFillRange(ctx context.Context, s string, from, to int, track bool) {
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s, Track: track})
	batch := make([]*stream.Job, 0, 100)
	for i := from; i < to; i++ {
		batch = append(batch, &stream.Job{Type: "bench", Payload: payload(i)})
		if len(batch) == cap(batch) || i == to-1 {
			if _, err := p.EnqueueBatch(ctx, batch); err != nil {
				b.fatalf("EnqueueBatch: %v", err)
			}
			batch = batch[:0]
		}
	}
}

func (b *bench) pelicanProduce(ctx context.Context, tag string) result {
	return b.pelicanProduceTracked(ctx, tag, false)
}

// pelicanProduceTracked is pelicanProduce, with tracked jobs if track.
func (b *bench) pelicanProduceTracked(ctx context.Context, tag string, track bool) result {
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	m := b.startMeter(ctx)
	b.pelicanFillRange(ctx, s, 0, b.n, track)
	r := m.stop(ctx, b.n)
	if l := b.rdb.XLen(ctx, s).Val(); l != int64(b.n) {
		b.fatalf("pelican produce: %d entries in the stream, want %d", l, b.n)
	}
	if track {
		b.checkTracked(ctx, "pelican produce tracked", s, stream.StateWaiting, b.n)
	}
	return r
}

// checkTracked fails the bench unless stream s's queue holds exactly n
// index records, each in state want, and each naming a distinct job.
func (b *bench) checkTracked(ctx context.Context, what, s, want string, n int) {
	keys, _ := stream.KeysFor(s)
	seen := make(map[string]bool, n)
	iter := b.rdb.Scan(ctx, 0, keys.Job+"*", 1000).Iterator()
	var batch []string
	flush := func() {
		if len(batch) == 0 {
			return
		}
		vs, err := b.rdb.MGet(ctx, batch...).Result()
		if err != nil {
			b.fatalf("%s: MGET records: %v", what, err)
		}
		for i, v := range vs {
			str, _ := v.(string)
			r, err := stream.ParseRecord(str)
			if err != nil || r.State != want {
				b.fatalf("%s: record %s = %q (%v), want state %s", what, batch[i], str, err, want)
			}
			seen[batch[i]] = true
		}
		batch = batch[:0]
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			flush()
		}
	}
	flush()
	if err := iter.Err(); err != nil {
		b.fatalf("%s: SCAN records: %v", what, err)
	}
	if len(seen) != n {
		b.fatalf("%s: %d distinct index records, want %d", what, len(seen), n)
	}
}

// chain returns the middleware of a phase, outermost first, in the order
// the README prescribes (tracing, metrics, lock, idempotency, Retry,
// DeadLetter), and what to call when the run is over. Lock and idempotency
// keys go under the run's tag, so that cleanupRun finds them.
func (b *bench) chain(tag, name string) ([]consumer.Middleware, func()) {
	if name == "" {
		return nil, func() {}
	}
	m := metrics.New(prometheus.NewRegistry(), metrics.Config{})
	retry := middleware.Retry(middleware.RetryConfig{})
	dead := middleware.DeadLetter(middleware.DeadLetterConfig{MaxAge: 24 * time.Hour})
	lock := func() consumer.Middleware {
		return middleware.Lock(b.rdb, middleware.LockConfig{
			Key: func(j *stream.Job) string { return j.ID }, // a lock key per job
		})
	}
	idemp := func() consumer.Middleware {
		return middleware.Idempotency(idem.NewRedisStore(b.rdb, idem.RedisConfig{}),
			middleware.IdempotencyConfig{Missing: middleware.MissingUseJobID, Logger: quiet()})
	}
	switch name {
	case "lock":
		return []consumer.Middleware{lock()}, func() {}
	case "idem":
		return []consumer.Middleware{idemp()}, func() {}
	case "mid":
		return []consumer.Middleware{m.Middleware(), retry, dead}, func() {}
	case "full":
		// The SDK with a 1% sampler and no exporter: what sampling costs
		// when most jobs are not sampled.
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0.01)))
		return []consumer.Middleware{
			tracing.Middleware(tracing.Config{TracerProvider: tp}),
			m.Middleware(),
			lock(),
			idemp(),
			retry,
			dead,
		}, func() { _ = tp.Shutdown(context.Background()) }
	}
	panic("bench: unknown chain " + name)
}

// pelicanConsume runs one consumer over b.n jobs (a backlog, or jobs
// produced meanwhile) until all are acknowledged.
func (b *bench) pelicanConsume(ctx context.Context, tag string, v variant) result {
	if v.pool {
		return b.pelicanPool(ctx, tag, v)
	}
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	if !v.produce {
		b.pelicanFillRange(ctx, s, 0, b.n, v.track)
	}
	set := newJobSet(b.n).withIDs()
	h := consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
		first := seeJob(set, j.Payload, j.ID)
		switch {
		case v.mode == retryOnce && j.Attempt == 0:
			return consumer.Retry(0, errOnce)
		case v.mode == snoozeOnce && first:
			return consumer.Snooze(0)
		}
		return nil
	})
	mws, closeChain := b.chain(tag, v.chain)
	defer closeChain()
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: pelicanGroup, Concurrency: v.conc, Prefetch: b.prefetch, Logger: quiet()}).
		Use(mws...).Handle(h)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := b.startMeter(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	produced := make(chan struct{})
	if v.produce {
		go func() { b.pelicanFill(ctx, s, b.n); close(produced) }()
	} else {
		close(produced)
	}
	b.waitFor("pelican consume", func() bool { return c.Stats().Acked >= uint64(b.n) }, func() string {
		return fmt.Sprintf("%+v; %d distinct jobs ran", c.Stats(), set.distinct.Load())
	})
	r := m.stop(ctx, b.n)
	<-produced
	cancel()
	if err := <-errc; err != nil {
		b.fatalf("pelican consume: Run: %v", err)
	}
	b.checkPelican(ctx, "pelican consume", s, c.Stats(), set, b.n, v.mode)
	if v.track {
		b.checkTracked(ctx, "pelican consume tracked", s, stream.StateDone, b.n)
	}
	return r
}

// checkPelican fails the bench unless exactly n distinct jobs ran, as many
// times as the mode says, each settled once, and the queue is empty.
func (b *bench) checkPelican(ctx context.Context, what, s string, st consumer.Stats, set *jobSet, n int, mode handlerMode) {
	runs := n
	if mode != plain {
		runs = 2 * n
	}
	if err := set.check(runs); err != nil {
		b.fatalf("%s: %v; stats %+v", what, err, st)
	}
	want := consumer.Stats{Acked: uint64(n)}
	switch mode {
	case retryOnce:
		want.Retried = uint64(n)
	case snoozeOnce:
		want.Snoozed = uint64(n)
	}
	got := st
	got.ReadErrors = 0 // a failed read that was retried settles nothing
	if got != want {
		b.fatalf("%s: stats %+v, want %+v", what, st, want)
	}
	keys, _ := stream.KeysFor(s)
	if p, err := b.rdb.XPending(ctx, s, pelicanGroup).Result(); err != nil || p.Count != 0 {
		b.fatalf("%s: pending left: %+v %v", what, p, err)
	}
	left := map[string]int64{
		"stream entries":      b.rdb.XLen(ctx, s).Val(),
		"delayed jobs":        b.rdb.ZCard(ctx, keys.Delayed).Val(),
		"dead-letter entries": b.rdb.XLen(ctx, keys.Dead).Val(),
	}
	for k, v := range left {
		if v != 0 {
			b.fatalf("%s: %d %s left", what, v, k)
		}
	}
}

// pelicanLatency measures Pelican's enqueue-to-handler latency: single
// Enqueue calls at the bench's rate, one consumer at concurrency conc.
func (b *bench) pelicanLatency(ctx context.Context, tag string, conc int) result {
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	total := b.latencyJobs()
	set, lat := newJobSet(total+1).withIDs(), newLatencies(total)
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: pelicanGroup, Concurrency: conc, Prefetch: b.prefetch, Logger: quiet()}).
		Handle(consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
			recordLatency(lat, j.Payload, j.Headers["sent"])
			seeJob(set, j.Payload, j.ID)
			return nil
		}))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s})
	send := func(seq int) {
		j := &stream.Job{Type: "bench", Payload: payload(seq),
			Headers: map[string]string{"sent": strconv.FormatInt(time.Now().UnixNano(), 10)}}
		if _, err := p.Enqueue(ctx, j); err != nil {
			b.fatalf("Enqueue: %v", err)
		}
	}
	r := b.paced(ctx, "pelican latency", total, send, func() int64 { return int64(c.Stats().Acked) })
	cancel()
	if err := <-errc; err != nil {
		b.fatalf("pelican latency: Run: %v", err)
	}
	b.checkPelican(ctx, "pelican latency", s, c.Stats(), set, total+1, plain)
	r.p50, r.p99 = lat.percentiles()
	return r
}

// pelicanPool runs one consumer.Pool over three streams of the run's tag
// (weights 6/3/1, Concurrency v.conc) until all b.n jobs, a third in each
// stream, are acknowledged.
func (b *bench) pelicanPool(ctx context.Context, tag string, v variant) result {
	streams := []string{streamOf(tag), "{" + tag + "}:jobs2", "{" + tag + "}:jobs3"}
	defer b.cleanupRun(ctx, tag)
	for i, s := range streams {
		b.pelicanFillRange(ctx, s, i*b.n/3, (i+1)*b.n/3, false)
	}
	set := newJobSet(b.n).withIDs()
	h := consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
		seeJob(set, j.Payload, j.ID)
		return nil
	})
	p := consumer.NewPool(b.rdb, consumer.PoolConfig{Concurrency: v.conc, Logger: quiet()})
	var qs []*consumer.Queue
	for i, s := range streams {
		qs = append(qs, p.Add(consumer.Config{Stream: s, Group: pelicanGroup, Logger: quiet()},
			consumer.QueueOptions{Weight: []int{6, 3, 1}[i]}).Handle(h))
	}
	stats := func() consumer.Stats {
		var st consumer.Stats
		for _, q := range qs {
			st.Acked += q.Stats().Acked
		}
		return st
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := b.startMeter(ctx)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(runCtx) }()
	b.waitFor("pelican pool", func() bool { return stats().Acked >= uint64(b.n) }, func() string {
		return fmt.Sprintf("%+v; %d distinct jobs ran", stats(), set.distinct.Load())
	})
	r := m.stop(ctx, b.n)
	cancel()
	if err := <-errc; err != nil {
		b.fatalf("pelican pool: Run: %v", err)
	}
	if err := set.check(b.n); err != nil {
		b.fatalf("pelican pool: %v", err)
	}
	for i, s := range streams {
		n := (i+1)*b.n/3 - i*b.n/3
		if st := qs[i].Stats(); st.Acked != uint64(n) || st.Retried+st.Snoozed+st.DeadLettered+st.Lost+st.Stale != 0 {
			b.fatalf("pelican pool: stream %s: stats %+v, want %d acked and nothing else", s, st, n)
		}
		if pend, err := b.rdb.XPending(ctx, s, pelicanGroup).Result(); err != nil || pend.Count != 0 || b.rdb.XLen(ctx, s).Val() != 0 {
			b.fatalf("pelican pool: stream %s: pending %+v (%v), %d entries left", s, pend, err, b.rdb.XLen(ctx, s).Val())
		}
	}
	return r
}
