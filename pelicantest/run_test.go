package pelicantest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// fatalTB records the first Fatalf and stops the calling goroutine's work
// as testing.T would (here: by panicking, recovered by the caller).
type fatalTB struct {
	msg      string
	cleanups []func()
}

type fatal struct{}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatal{})
}

func runFatal(f *fatalTB, fn func()) {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(fatal); !ok {
				panic(v)
			}
		}
	}()
	fn()
}

// A bad consumer configuration fails Run with the field's name before the
// job is enqueued. Red check: enqueueing before starting the consumer
// leaves the job in the stream.
func TestRun_badConfigEnqueuesNothing(t *testing.T) {
	r := NewRedis(t)
	f := &fatalTB{}
	job, _ := stream.NewJob("t", nil)
	h := consumer.HandlerFunc(func(context.Context, *stream.Job) error { return nil })
	runFatal(f, func() {
		Run(f, h, job, WithRedis(r), WithConfig(consumer.Config{VisibilityTimeout: -time.Second}))
	})
	if !strings.Contains(f.msg, "Config.VisibilityTimeout") {
		t.Fatalf("Run failed with %q, want the field named", f.msg)
	}
	jobs, err := Jobs(context.Background(), r.Client, r.Name("jobs"))
	if err != nil || len(jobs) != 0 {
		t.Fatalf("jobs after a refused Run: %v, %v; want none", jobs, err)
	}
}
