package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// A worker whose entries were reclaimed by another consumer while their
// handlers ran settles none of them, whatever their outcome (done, retry,
// snooze, dead letter), though they settle in batches, the retries and
// snoozes in one script; and in a batch where some entries are another
// consumer's or no longer pending, the others settle. Against real Redis.
// The heartbeat is off (negative HeartbeatInterval), so that only the
// settlement's owner check can catch the reclaim.
func TestConsumer_staleSettlesNothing(t *testing.T) {
	t.Parallel()
	kinds := []string{"ack", "retry", "snooze", "dead"}
	for _, tc := range []struct {
		name string
		// take: the jobs (by kind, index 0 or 1) reclaimed by consumer b;
		// gone: the ones acknowledged meanwhile by someone else.
		take, gone []string
	}{
		{name: "all reclaimed", take: []string{"ack0", "ack1", "retry0", "retry1", "snooze0", "snooze1", "dead0", "dead1"}},
		{name: "some reclaimed, one gone", take: []string{"ack0", "retry0", "snooze0", "dead0"}, gone: []string{"retry1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			ctx := context.Background()
			q := "{" + redistest.Prefix(t, rdb) + "}q"
			keys, _ := stream.KeysFor(q)
			var jobs []*stream.Job
			var names []string // per job: its kind and index, "retry1"
			for _, k := range kinds {
				for i := range 2 {
					jobs = append(jobs, &stream.Job{Type: k, Payload: []byte("{}")})
					names = append(names, fmt.Sprintf("%s%d", k, i))
				}
			}
			entries, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q}).EnqueueBatch(ctx, jobs)
			if err != nil {
				t.Fatal(err)
			}
			entry := map[string]string{} // name -> entry ID
			for i, name := range names {
				entry[name] = entries[i]
			}
			var mu sync.Mutex
			started := 0
			release := make(chan struct{})
			c := consumer.New(rdb, consumer.Config{Stream: q, Group: "g", Consumer: "a", Concurrency: len(jobs), Logger: discard,
				HeartbeatInterval: -1, VisibilityTimeout: time.Hour, SweepInterval: time.Hour}).
				Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
					mu.Lock()
					started++
					mu.Unlock()
					<-release
					switch j.Type {
					case "retry":
						return consumer.Retry(time.Hour, errors.New("once"))
					case "snooze":
						return consumer.Snooze(time.Hour)
					case "dead":
						return consumer.Permanent(errors.New("never"))
					}
					return nil
				}))
			r := start(t, c)
			poll.Until(t, 30*time.Second, poll.True("every job started", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return started == len(jobs)
			}))
			var take []string
			for _, name := range tc.take {
				take = append(take, entry[name])
			}
			if got := rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: q, Group: "g", Consumer: "b", MinIdle: 0, Messages: take}).Val(); len(got) != len(take) {
				t.Fatalf("b reclaimed %v; want %v", got, take)
			}
			for _, name := range tc.gone {
				rdb.XAck(ctx, q, "g", entry[name])
			}
			close(release)
			want := consumer.Stats{Stale: uint64(len(tc.take) + len(tc.gone))}
			for i, name := range names {
				if slices.Contains(tc.take, name) || slices.Contains(tc.gone, name) {
					continue
				}
				switch jobs[i].Type {
				case "ack":
					want.Acked++
				case "retry":
					want.Retried++
				case "snooze":
					want.Snoozed++
				case "dead":
					want.DeadLettered++
				}
			}
			settled := func(s consumer.Stats) [5]uint64 {
				return [5]uint64{s.Stale, s.Acked, s.Retried, s.Snoozed, s.DeadLettered}
			}
			poll.Until(t, 30*time.Second, func() (bool, string) {
				st := c.Stats()
				return settled(st) == settled(want), fmt.Sprintf("stats %+v; want stale, acked, retried, snoozed, dead %v", st, settled(want))
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q, Group: "g", Start: "-", End: "+", Count: 100}).Val()
			if len(p) != len(take) {
				t.Errorf("%d entries pending; want b's %d", len(p), len(take))
			}
			for _, e := range p {
				if e.Consumer != "b" || !slices.Contains(take, e.ID) {
					t.Errorf("pending %+v; want only b's entries", e)
				}
			}
			if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != int64(want.Retried+want.Snoozed) {
				t.Errorf("delayed set holds %d; want %d", n, want.Retried+want.Snoozed)
			}
			if n := rdb.XLen(ctx, keys.Dead).Val(); n != int64(want.DeadLettered) {
				t.Errorf("dead-letter stream holds %d; want %d", n, want.DeadLettered)
			}
			// Nothing new in the stream: the retries and snoozes went to the
			// delayed set; b's entries are all still there.
			for _, id := range take {
				if len(rdb.XRange(ctx, q, id, id).Val()) != 1 {
					t.Errorf("b's entry %s was deleted", id)
				}
			}
		})
	}
}

// The Warn record of a retry is logged at most once a second, and counts
// the ones held back (suppressed_retries): every retry is accounted for,
// with no record per retry. With Debug on, every retry has its record.
// Against real Redis.
func TestConsumer_retryLogRateLimited(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelWarn, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			q := "{" + redistest.Prefix(t, rdb) + "}q"
			const n = 50
			jobs := make([]*stream.Job, n)
			for i := range jobs {
				jobs[i] = &stream.Job{Type: "t", Payload: []byte("{}")}
			}
			if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q}).EnqueueBatch(context.Background(), jobs); err != nil {
				t.Fatal(err)
			}
			logger, logs := newCapture(level)
			began := time.Now()
			c := consumer.New(rdb, consumer.Config{Stream: q, Group: "g", Concurrency: 10, Logger: logger}).
				Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error {
					return consumer.Retry(time.Hour, errors.New("later"))
				}))
			r := start(t, c)
			waitFor(t, 30*time.Second, "every job retried", func() bool { return c.Stats().Retried == n })
			took := time.Since(began)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			recs := logs.withMsg("job failed; retry scheduled")
			counted := len(recs)
			for _, rec := range recs {
				if v, ok := rec.attrs["suppressed_retries"]; ok {
					counted += int(v.Int64())
				}
			}
			if level == slog.LevelDebug {
				if len(recs) != n {
					t.Errorf("%d retry records with Debug on; want %d", len(recs), n)
				}
				return
			}
			// The last held back are counted only by a later record.
			if max := 1 + int(took/time.Second); len(recs) > max || counted > n || len(recs) == 0 {
				t.Errorf("%d retry records (counting %d retries) for %d retries in %v; want 1 to %d", len(recs), counted, n, took, max)
			}
		})
	}
}
