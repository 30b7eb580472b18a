package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

type a11Obs struct {
	typ     string
	attempt int // job.Attempt as the handler saw it
	last    string
	d       consumer.Decision
}

// Promise (consumer.Decide, Decision): "the consumer settles every job from the
// Decision it returns, and middleware that needs the outcome calls it"; Config
// OnDeadLetter: "called after a job was written to the dead-letter stream,
// whoever decided its death ... with d.DeadEntryID set"; RedactDeadLetter:
// "field values that replace the job's own in its dead-letter copy ... fields the
// entry does not have are ignored, and the source entry is left as it is"; retry:
// "schedule the next attempt ... with attempt incremented and the error
// recorded". An observer middleware calling Decide must agree with what the
// consumer did, counted three ways: Stats, the dead-letter stream, OnDeadLetter.
func TestAttack11_DecideMatchesSettlement(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	obs := map[string][]a11Obs{} // job ID -> observations in order
	var dls []consumer.DeadLetter
	observer := func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(hctx context.Context, job *stream.Job) (err error) {
			defer func() {
				// Record even if a panic unwinds through here.
				r := recover()
				if r != nil {
					err = &consumer.PanicError{Value: r}
				}
				d := consumer.Decide(hctx, job, err)
				mu.Lock()
				obs[job.ID] = append(obs[job.ID], a11Obs{job.Type, job.Attempt, job.LastError, d})
				mu.Unlock()
				if r != nil {
					panic(r)
				}
			}()
			return next.Process(hctx, job)
		})
	}
	handler := consumer.HandlerFunc(func(hctx context.Context, job *stream.Job) error {
		switch job.Type {
		case "ok":
			return nil
		case "fail":
			return fmt.Errorf("fail attempt %d", job.Attempt)
		case "flaky": // fails twice, then succeeds
			if job.Attempt < 2 {
				return consumer.Retryable(fmt.Errorf("flaky %d", job.Attempt))
			}
			return nil
		case "permanent":
			return consumer.Permanent(errors.New("nope"))
		case "payload":
			return fmt.Errorf("bad body: %w", stream.ErrPayload)
		case "dead":
			return consumer.Dead("custom_reason", errors.New("told to die"))
		case "panic":
			panic("boom")
		case "snooze":
			if job.Attempt == 0 && job.LastError == "" && len(job.Headers) == 0 {
				mu.Lock()
				n := 0
				for _, o := range obs[job.ID] {
					if o.typ == "snooze" {
						n++
					}
				}
				mu.Unlock()
				if n == 0 {
					return consumer.Snooze(15 * time.Millisecond)
				}
			}
			return nil
		case "retryafter":
			if job.Attempt == 0 {
				return consumer.RetryAfter(15*time.Millisecond, errors.New("later"))
			}
			return nil
		}
		return errors.New("unexpected type " + job.Type)
	})
	c := consumer.New(rdb, consumer.Config{
		Stream: name, Group: "g", Consumer: "A",
		Concurrency: 4, MaxAttempts: 3,
		Backoff:         consumer.Backoff{Base: 10 * time.Millisecond, Cap: 40 * time.Millisecond},
		PromoteInterval: 20 * time.Millisecond, Block: 100 * time.Millisecond,
		KeepSettled: true,
		OnDeadLetter: func(_ context.Context, d consumer.DeadLetter) {
			mu.Lock()
			dls = append(dls, d)
			mu.Unlock()
		},
		RedactDeadLetter: func(job *stream.Job) map[string]string {
			return map[string]string{"payload": "<redacted>", "nosuch": "x"}
		},
	}).Use(observer).Handle(handler)

	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	types := []string{"ok", "ok", "fail", "fail", "flaky", "permanent", "payload", "dead", "panic", "snooze", "retryafter"}
	ids := map[string]string{} // job ID -> type
	for i, typ := range types {
		j, _ := stream.NewJSONJob(typ, map[string]any{"secret": "s3cr3t", "i": i})
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		ids[j.ID] = typ
	}
	// A malformed entry, as a non-Go producer would write it (no type).
	if err := rdb.Do(ctx, "XADD", name, "*", "payload", "raw-secret").Err(); err != nil {
		t.Fatal(err)
	}
	wantDead := map[string]string{"fail": consumer.ReasonExhausted, "permanent": consumer.ReasonPermanent,
		"payload": consumer.ReasonPermanent, "dead": "custom_reason", "panic": consumer.ReasonPanic}

	run := make(chan error, 1)
	go func() { run <- c.Run(context.Background()) }()
	terminal := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range ids {
			o := obs[id]
			if len(o) == 0 {
				return false
			}
			if k := o[len(o)-1].d.Kind; k != consumer.KindAck && k != consumer.KindDead {
				return false
			}
		}
		return true
	}
	a11Poll(t, 60*time.Second, "every job to reach a terminal decision", terminal)
	a11Poll(t, 60*time.Second, "settled: nothing pending or delayed, every dead letter written", func() bool {
		n, err := rdb.XPending(ctx, name, "g").Result()
		z, err2 := rdb.ZCard(ctx, keys.Delayed).Result()
		l, err3 := rdb.XLen(ctx, keys.Dead).Result()
		mu.Lock()
		nd := len(dls)
		mu.Unlock()
		return err == nil && err2 == nil && err3 == nil && n.Count == 0 && z == 0 && l == 7 && nd == 7
	})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := c.WaitIdle(wctx); err != nil {
		t.Fatalf("WaitIdle: %v", err)
	}
	cancel()
	st := c.Stats()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_ = c.Shutdown(sctx)
	cancel()
	<-run

	mu.Lock()
	defer mu.Unlock()
	count := map[consumer.Kind]uint64{}
	for id, typ := range ids {
		o := obs[id]
		for i, x := range o {
			count[x.d.Kind]++
			if x.d.Attempt != x.attempt+1 {
				t.Errorf("%s: Decision.Attempt %d, job.Attempt %d", typ, x.d.Attempt, x.attempt)
			}
			if i > 0 && o[i-1].d.Kind == consumer.KindRetry {
				if x.attempt != o[i-1].attempt+1 {
					t.Errorf("%s: attempt %d after retry of attempt %d", typ, x.attempt, o[i-1].attempt)
				}
				if o[i-1].d.Err != nil && x.last != o[i-1].d.Err.Error() {
					t.Errorf("%s: LastError %q, Decision.Err of the previous attempt %q", typ, x.last, o[i-1].d.Err.Error())
				}
			}
		}
		final := o[len(o)-1].d
		if r, ok := wantDead[typ]; ok {
			if final.Kind != consumer.KindDead || final.Reason != r {
				t.Errorf("%s: final decision %+v, want dead %q", typ, final, r)
			}
		} else if final.Kind != consumer.KindAck {
			t.Errorf("%s: final decision %+v, want ack", typ, final)
		}
	}
	t.Logf("observed kinds %v; stats %+v", count, st)
	if count[consumer.KindAck] != st.Acked || count[consumer.KindRetry] != st.Retried ||
		count[consumer.KindSnooze] != st.Snoozed || count[consumer.KindDead]+1 != st.DeadLettered {
		t.Errorf("observer counts %v disagree with Stats %+v (DeadLettered includes 1 malformed)", count, st)
	}
	// The dead-letter stream against Decide and OnDeadLetter.
	dead, err := rdb.XRange(ctx, keys.Dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byDeadID := map[string]consumer.DeadLetter{}
	for _, d := range dls {
		if d.DeadEntryID == "" {
			t.Errorf("OnDeadLetter without DeadEntryID: %+v", d)
		}
		if _, dup := byDeadID[d.DeadEntryID]; dup {
			t.Errorf("OnDeadLetter twice for %s", d.DeadEntryID)
		}
		byDeadID[d.DeadEntryID] = d
	}
	for _, m := range dead {
		d, ok := byDeadID[m.ID]
		if !ok {
			t.Errorf("dead entry %s had no OnDeadLetter call", m.ID)
			continue
		}
		if _, ok := m.Values["nosuch"]; ok {
			t.Errorf("dead entry %s got a field the entry did not have: %v", m.ID, m.Values)
		}
		if d.Reason != m.Values["dead_reason"] {
			t.Errorf("dead entry %s: dead_reason %v, OnDeadLetter %q", m.ID, m.Values["dead_reason"], d.Reason)
		}
		if a, _ := strconv.Atoi(fmt.Sprint(m.Values["dead_attempts"])); a != d.Attempts {
			t.Errorf("dead entry %s: dead_attempts %v, OnDeadLetter %d", m.ID, m.Values["dead_attempts"], d.Attempts)
		}
		if d.Job == nil { // the malformed one
			if m.Values["dead_reason"] != consumer.ReasonMalformed {
				t.Errorf("nil-job dead letter %v", m.Values)
			}
			continue
		}
		if m.Values["payload"] != "<redacted>" {
			t.Errorf("dead entry %s (%s) payload %q not redacted", m.ID, d.Job.Type, m.Values["payload"])
		}
		o := obs[d.Job.ID]
		final := o[len(o)-1].d
		if final.Reason != d.Reason || final.Attempt != d.Attempts {
			t.Errorf("%s: Decide said %+v, dead letter says reason %q attempts %d", d.Job.Type, final, d.Reason, d.Attempts)
		}
		if final.Err != nil && final.Err.Error() != d.Error && d.Job.Type != "panic" {
			t.Errorf("%s: Decision.Err %q, dead_error %q", d.Job.Type, final.Err.Error(), d.Error)
		}
		// The source entry is left as it is (KeepSettled).
		src, err := rdb.XRange(ctx, name, d.EntryID, d.EntryID).Result()
		if err != nil || len(src) != 1 || src[0].Values["payload"] == "<redacted>" {
			t.Errorf("%s: source entry %s changed or gone: %v %v", d.Job.Type, d.EntryID, src, err)
		}
	}
}
