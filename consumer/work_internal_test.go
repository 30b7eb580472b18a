package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/pelicanqueue/pelican/stream"
)

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestTask_doneChan(t *testing.T) {
	t.Parallel()
	t.Run("waited for, then ended", func(t *testing.T) {
		t.Parallel()
		var tk task
		ch := tk.doneChan()
		if closed(ch) || closed(tk.doneChan()) {
			t.Fatal("done before end")
		}
		tk.end()
		if !closed(ch) || !closed(tk.doneChan()) {
			t.Fatal("not done after end")
		}
	})
	t.Run("ended, then waited for", func(t *testing.T) {
		t.Parallel()
		var tk task
		tk.end()
		if !closed(tk.doneChan()) {
			t.Fatal("not done after end")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		for range 200 {
			var tk task
			var wg sync.WaitGroup
			chans := make([]<-chan struct{}, 4)
			for i := range chans {
				wg.Go(func() { chans[i] = tk.doneChan() })
			}
			wg.Go(tk.end)
			wg.Wait()
			for _, ch := range chans {
				<-ch // every waiter's channel is closed: no hang
			}
		}
	})
}

// TestVerdict_leaseEnded: a job dead-lettered without running (malformed,
// or crashed MaxCrashes times) keeps its reason when its lease ended while
// it waited (its context cancelled with ErrLeaseLost). Decide on that
// context calls it abandoned; the dead letter was then written with an
// empty reason (TestAttack9_poison_severalAtOnce_sameNamesSlowRestart saw
// dead_reason "" under load).
func TestVerdict_leaseEnded(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{ReasonCrashed, ReasonMalformed} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(errLeaseExpired)
			var job *stream.Job
			if reason == ReasonCrashed {
				job = &stream.Job{ID: "j", Attempt: 2}
			}
			dec := verdict(ctx, job, delivery{id: "1-1", deliveries: 4}, reason, errors.New("cause"))
			if dec.Kind != KindDead || dec.Reason != reason {
				t.Fatalf("verdict after the lease ended = %v %q, want dead with reason %q", dec.Kind, dec.Reason, reason)
			}
			if job == nil && dec.Attempt != 4 {
				t.Errorf("malformed entry's attempt = %d, want its deliveries (4)", dec.Attempt)
			}
		})
	}
}
