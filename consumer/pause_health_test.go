package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestHealth_pauses: Health and Stats show the pauses the consumer follows
// and the jobs it holds because of them, and none once resumed. Held jobs
// are not in flight: InFlight counts the running job of the type not
// paused, not the three read and held.
func TestHealth_pauses(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, _ := stream.KeysFor(name)
	ctx := context.Background()
	t.Cleanup(func() { rdb.Del(context.Background(), name, keys.Paused, keys.Delayed, keys.Dead) })
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{Type: "a"}); err != nil {
		t.Fatal(err)
	}
	bStarted, releaseB := make(chan struct{}), make(chan struct{})
	c := consumer.New(rdb, consumer.Config{Stream: name, Group: "g", Consumer: "c1", Block: 20 * time.Millisecond, Logger: discard}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			if j.Type == "b" {
				close(bStarted)
				<-releaseB
			}
			return nil
		}))
	start(t, c)
	<-c.Reading()
	prod := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name})
	for i := range 3 {
		if _, err := prod.Enqueue(ctx, &stream.Job{Type: "a", Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := prod.Enqueue(ctx, &stream.Job{Type: "b", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		h := c.Health()
		return h.Held == 3 && c.Stats().Held == 3 && !h.Paused && slices.Equal(h.PausedTypes, []string{"a"}) && h.Ready,
			fmt.Sprintf("health %+v, stats held %d; want 3 held, type a paused", h, c.Stats().Held)
	})
	recv(t, bStarted, 30*time.Second, "the job of type b to start")
	if h := c.Health(); h.InFlight != 1 {
		t.Errorf("InFlight = %d with one job running and 3 held (%+v); want 1", h.InFlight, h)
	}
	close(releaseB)
	if err := control.Pause(ctx, rdb, name, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, poll.True("the queue's pause in Health", func() bool { return c.Health().Paused }))
	if err := control.Resume(ctx, rdb, name, control.ResumeOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		h := c.Health()
		return h.Held == 0 && !h.Paused && h.PausedTypes == nil && c.Stats().Acked == 4,
			fmt.Sprintf("health %+v, acked %d; want nothing held or paused, 4 acked", h, c.Stats().Acked)
	})
}
