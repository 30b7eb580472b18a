package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// tracer records the entry and exit of middleware and handler, and how many
// times each middleware was built.
type tracer struct {
	mu     sync.Mutex
	events []string
	built  map[string]*atomic.Int32
}

func newTracer() *tracer { return &tracer{built: map[string]*atomic.Int32{}} }

func (tr *tracer) record(e string) {
	tr.mu.Lock()
	tr.events = append(tr.events, e)
	tr.mu.Unlock()
}

func (tr *tracer) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	e := tr.events
	tr.events = nil
	return e
}

func (tr *tracer) mw(name string) consumer.Middleware {
	n := &atomic.Int32{}
	tr.built[name] = n
	return func(next consumer.Handler) consumer.Handler {
		n.Add(1)
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			tr.record(">" + name)
			err := next.Process(ctx, job)
			tr.record("<" + name)
			return err
		})
	}
}

func TestChain(t *testing.T) {
	t.Parallel()

	t.Run("FirstIsOutermost", func(t *testing.T) {
		t.Parallel()
		tr := newTracer()
		h := consumer.Chain(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			tr.record("handler")
			return nil
		}), tr.mw("a"), tr.mw("b"), tr.mw("c"))
		if err := h.Process(context.Background(), &stream.Job{Type: "t"}); err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Join(tr.take(), " "), ">a >b >c handler <c <b <a"; got != want {
			t.Errorf("order = %q, want %q", got, want)
		}
	})

	t.Run("NoMiddlewareIsTheHandler", func(t *testing.T) {
		t.Parallel()
		want := errors.New("mine")
		h := consumer.Chain(consumer.HandlerFunc(func(context.Context, *stream.Job) error { return want }))
		if err := h.Process(context.Background(), &stream.Job{}); err != want {
			t.Errorf("Process = %v, want the handler's error", err)
		}
	})
}

func TestConsumer_Use(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jobs = 3
	for i := range jobs {
		b.enqueue(t, "t", i)
	}
	b.cfg.Concurrency = 1 // one job at a time, so the events of jobs do not interleave
	tr := newTracer()
	c := consumer.New(b.rdb, b.cfg).
		Use(tr.mw("first")).
		Use(tr.mw("second"), tr.mw("third")).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
			tr.record("handler")
			return nil
		}))
	start(t, c)
	waitFor(t, 5*time.Second, "every job acknowledged", func() bool { return c.Stats().Acked == jobs })

	one := ">first >second >third handler <third <second <first"
	want := strings.TrimSpace(strings.Repeat(one+" ", jobs))
	if got := strings.Join(tr.take(), " "); got != want {
		t.Errorf("events through Run =\n%s\nwant\n%s", got, want)
	}
	for name, n := range tr.built {
		if n.Load() != 1 {
			t.Errorf("middleware %s was built %d times for %d jobs; want once", name, n.Load(), jobs)
		}
	}
}

func TestMux_Process(t *testing.T) {
	t.Parallel()

	t.Run("RoutesByType", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var mu sync.Mutex
		got := map[string][]string{}
		route := func(name string) func(context.Context, *stream.Job) error {
			return func(_ context.Context, j *stream.Job) error {
				var v string
				if err := j.Decode(&v); err != nil {
					return err
				}
				mu.Lock()
				got[name] = append(got[name], j.Type+":"+v)
				mu.Unlock()
				return nil
			}
		}
		mux := consumer.NewMux().HandleFunc("email.send", route("email")).HandleFunc("sms.send", route("sms"))
		b.enqueue(t, "email.send", "a")
		b.enqueue(t, "sms.send", "b")
		b.enqueue(t, "email.send", "c")
		unknownID, unknown := b.enqueue(t, "fax.send", "d")
		c := consumer.New(b.rdb, b.cfg).Handle(mux)
		start(t, c)
		waitFor(t, 5*time.Second, "three jobs acknowledged", func() bool { return c.Stats().Acked == 3 })
		waitFor(t, 5*time.Second, "the unknown type dead-lettered", func() bool { return len(b.dead(t)) == 1 })

		mu.Lock()
		for _, v := range got {
			slices.Sort(v) // jobs run concurrently
		}
		if fmt.Sprint(got) != "map[email:[email.send:a email.send:c] sms:[sms.send:b]]" {
			t.Errorf("routed = %v", got)
		}
		mu.Unlock()
		d := b.dead(t)[0]
		if field(d, "dead_reason") != consumer.ReasonUnknownType || field(d, "dead_entry_id") != unknownID ||
			field(d, "job_id") != unknown.ID || !strings.Contains(field(d, "dead_error"), `"fax.send"`) {
			t.Errorf("dead-letter entry = %v; want reason unknown_type for %s naming fax.send", d.Values, unknownID)
		}
	})

	t.Run("UnknownTypeIsDead", func(t *testing.T) {
		t.Parallel()
		err := consumer.NewMux().Process(context.Background(), &stream.Job{Type: "nope"})
		var o *consumer.Outcome
		if !errors.As(err, &o) || consumer.Decide(context.Background(), &stream.Job{Type: "nope"}, err).Kind != consumer.KindDead || o.Reason() != consumer.ReasonUnknownType {
			t.Errorf("Process of an unknown type = %v; want a Dead outcome with reason unknown_type", err)
		}
	})
}

func TestMux_Handle(t *testing.T) {
	t.Parallel()
	ok := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	for _, tc := range []struct {
		name      string
		reg       func(m *consumer.Mux)
		wantPanic string
	}{
		{"Duplicate", func(m *consumer.Mux) { m.Handle("a", ok).Handle("a", ok) }, `"a" registered twice`},
		{"DuplicateViaHandleFunc", func(m *consumer.Mux) { m.Handle("a", ok).HandleFunc("a", ok) }, `"a" registered twice`},
		{"EmptyType", func(m *consumer.Mux) { m.Handle("", ok) }, "needs a job type"},
		{"NilHandler", func(m *consumer.Mux) { m.Handle("a", nil) }, "needs a job type and a handler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				v := recover()
				if s, _ := v.(string); !strings.Contains(s, tc.wantPanic) {
					t.Errorf("panic = %v, want one containing %q", v, tc.wantPanic)
				}
			}()
			tc.reg(consumer.NewMux())
		})
	}
}
