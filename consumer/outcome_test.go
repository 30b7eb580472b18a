package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

func TestOutcome_Error(t *testing.T) {
	t.Parallel()
	inner := errors.New("upstream 503")
	for _, tc := range []struct {
		name           string
		err            error
		text           string
		delay          time.Duration
		reason         string
		dead, counts   bool
		unwrapsToInner bool
	}{
		{"Retry", consumer.Retry(2*time.Second, inner), "retry in 2s: upstream 503", 2 * time.Second, "", false, true, true},
		{"RetryNoError", consumer.Retry(0, nil), "retry in 0s", 0, "", false, true, false},
		{"Snooze", consumer.Snooze(time.Minute), "snooze 1m0s", time.Minute, "", false, false, false},
		{"Dead", consumer.Dead("bad_input", inner), "dead-letter (bad_input): upstream 503", 0, "bad_input", true, false, true},
		{"DeadDefaultReason", consumer.Dead("", nil), "dead-letter (permanent)", 0, consumer.ReasonPermanent, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var o *consumer.Outcome
			if !errors.As(tc.err, &o) {
				t.Fatalf("%v is not an *Outcome", tc.err)
			}
			d := consumer.Decide(context.Background(), &stream.Job{ID: "j", EntryID: "1-0"}, tc.err)
			if o.Error() != tc.text || o.Delay() != tc.delay || o.Reason() != tc.reason ||
				(d.Kind == consumer.KindDead) != tc.dead || (d.Kind == consumer.KindRetry) != tc.counts {
				t.Errorf("got %q delay %v reason %q, decided %v; want %q %v %q dead %v counts %v", o.Error(), o.Delay(),
					o.Reason(), d.Kind, tc.text, tc.delay, tc.reason, tc.dead, tc.counts)
			}
			if errors.Is(tc.err, inner) != tc.unwrapsToInner {
				t.Errorf("errors.Is(%v, inner) = %v, want %v", tc.err, !tc.unwrapsToInner, tc.unwrapsToInner)
			}
		})
	}
}

func TestPanicError_Error(t *testing.T) {
	t.Parallel()
	p := &consumer.PanicError{Value: "boom", Stack: []byte("goroutine 1 [running]:")}
	if got := p.Error(); !strings.HasPrefix(got, "panic: boom\n") || !strings.HasSuffix(got, "goroutine 1 [running]:") {
		t.Errorf("Error() = %q; want the value, then the stack", got)
	}
}

// Decide runs for every job, twice or more with observers: on a job that
// succeeded it allocates nothing.
func TestDecide_successAllocatesNothing(t *testing.T) {
	job := &stream.Job{ID: "j", EntryID: "1-0", Attempt: 1}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _ = consumer.Decide(ctx, job, nil) }); n != 0 {
		t.Errorf("Decide of a success: %v allocations, want 0", n)
	}
}

// A job cancelled by an operator (cause ErrCancelled) is cancelled whatever
// its handler asked for (a retry, a dead letter, a plain error, the cause
// passed on by an inner context), except nil: the work completed, it is
// done.
func TestDecide_cancelled(t *testing.T) {
	t.Parallel()
	job := &stream.Job{ID: "j", EntryID: "1-0"}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(consumer.ErrCancelled)
	for _, err := range []error{consumer.Retry(time.Second, errors.New("x")), consumer.Dead("bad", nil),
		consumer.Permanent(errors.New("x")), errors.New("plain"), context.Cause(ctx)} {
		if d := consumer.Decide(ctx, job, err); d.Kind != consumer.KindCancelled || d.Failed() {
			t.Errorf("Decide(cancelled ctx, %v) = %v (failed %v); want cancelled, not a failure", err, d.Kind, d.Failed())
		}
	}
	if d := consumer.Decide(ctx, job, nil); d.Kind != consumer.KindAck {
		t.Errorf("Decide(cancelled ctx, nil) = %v; want ack (done)", d.Kind)
	}
	if d := consumer.Decide(context.Background(), job, fmt.Errorf("inner: %w", consumer.ErrCancelled)); d.Kind != consumer.KindCancelled {
		t.Errorf("Decide(err wrapping ErrCancelled) = %v; want cancelled", d.Kind)
	}
}
