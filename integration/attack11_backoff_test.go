package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// Promise (Config.Panic, Config.Backoff, Decide): under PanicRetry a panic is
// "retried with Config.Backoff until Config.MaxAttempts", then dead-lettered
// "exhausted"; "A retry whose delay is not given waits Config.Backoff's delay
// for the job (the same for every caller: see Backoff.Delay)"; Decision.Delay
// is "the exact delay the consumer schedules". So: the observer's Decision.Delay
// equals Backoff.Delay(job), the next attempt never starts earlier than that
// delay after the panic (a lower bound: safe on a loaded machine), and the job
// ends in one dead letter with reason exhausted after MaxAttempts runs.
func TestAttack11_PanicRetryBackoff(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	keys, _ := stream.KeysFor(name)
	bo := consumer.Backoff{Base: 150 * time.Millisecond, Cap: 600 * time.Millisecond}
	const maxAttempts = 4
	type rec struct {
		start, end time.Time
		attempt    int
		d          consumer.Decision
		want       time.Duration
	}
	var mu sync.Mutex
	var recs []rec
	var dls []consumer.DeadLetter
	observer := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(hctx context.Context, job *stream.Job) (err error) {
			start := time.Now()
			defer func() {
				r := recover()
				if r != nil {
					err = &consumer.PanicError{Value: r}
				}
				d := consumer.Decide(hctx, job, err)
				mu.Lock()
				recs = append(recs, rec{start, time.Now(), job.Attempt, d, bo.Delay(job)})
				mu.Unlock()
				if r != nil {
					panic(r)
				}
			}()
			return next.Process(hctx, job)
		})
	}
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "A",
		Panic: consumer.PanicRetry, Backoff: bo, MaxAttempts: maxAttempts,
		PromoteInterval: 20 * time.Millisecond, Block: 100 * time.Millisecond,
		OnDeadLetter: func(_ context.Context, d consumer.DeadLetter) { mu.Lock(); dls = append(dls, d); mu.Unlock() },
	}).Use(observer).Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { panic("always") }))
	run := make(chan error, 1)
	go func() { run <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Shutdown(sctx)
		<-run
	})
	j, _ := stream.NewJSONJob("p", 1)
	if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	a11Poll(t, 60*time.Second, "the dead letter", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dls) >= 1
	})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_ = c.WaitIdle(wctx)
	cancel()
	mu.Lock()
	defer mu.Unlock()
	if len(recs) != maxAttempts {
		t.Fatalf("ran %d times, want %d: %+v", len(recs), maxAttempts, recs)
	}
	for i, r := range recs {
		if r.attempt != i {
			t.Errorf("run %d saw attempt %d", i, r.attempt)
		}
		if i < maxAttempts-1 {
			if r.d.Kind != consumer.KindRetry || r.d.Delay != r.want {
				t.Errorf("run %d: decision %+v, want retry after Backoff.Delay %v", i, r.d, r.want)
			}
			if gap := recs[i+1].start.Sub(r.end); gap < r.d.Delay-5*time.Millisecond {
				t.Errorf("run %d started %v after run %d's panic, before its delay %v", i+1, gap, i, r.d.Delay)
			}
		} else if r.d.Kind != consumer.KindDead || r.d.Reason != consumer.ReasonExhausted {
			t.Errorf("last run: decision %+v, want dead exhausted", r.d)
		}
	}
	if len(dls) != 1 || dls[0].Reason != consumer.ReasonExhausted || dls[0].Attempts != maxAttempts || dls[0].DeadEntryID == "" {
		t.Errorf("dead letters %+v", dls)
	}
	if l, _ := rdb.XLen(ctx, keys.Dead).Result(); l != 1 {
		t.Errorf("dead-letter stream has %d entries, want 1", l)
	}
	if st := c.Stats(); st.Retried != maxAttempts-1 || st.DeadLettered != 1 {
		t.Errorf("stats %+v", st)
	}
}
