package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// pq is a partitioned queue of 3 partitions whose dead letters have
// chosen IDs, so that the queue's order is known.
type pq struct {
	rdb   *redis.Client
	p     *dlq.Partitioned
	parts []string
	// order is every dead letter as "<id>@<partition>", in the queue's
	// order; matchX those of type x.
	order, matchX []string
}

func setupPartitioned(t *testing.T) *pq {
	t.Helper()
	rdb := redistest.Shared(t)
	queue := redistest.Name(t)
	p, err := dlq.NewPartitioned(rdb, queue, 3, dlq.Config{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	q := &pq{rdb: rdb, p: p}
	ctx := context.Background()
	for _, d := range p.Partitions() {
		q.parts = append(q.parts, d.Source())
		lease, cursor := d.Keys()
		t.Cleanup(func() { rdb.Del(context.Background(), d.Source(), d.Stream(), lease, cursor) })
	}
	add := func(part int, id, typ string) {
		t.Helper()
		f := deadJob([]any{"job_id", "job-" + id + "-" + fmt.Sprint(part), "type", typ, "payload", "{}"}, "permanent", "e", time.UnixMilli(1), 1)
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.Partitions()[part].Stream(), ID: id, Values: f}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Partition i%3 gets ID 100+i; types alternate x, y; then ID 200-0 in
	// partitions 0 and 2 (a tie), and 201-0 in partition 1.
	for i := range 12 {
		typ := "x"
		if i%2 == 1 {
			typ = "y"
		}
		id := fmt.Sprintf("%d-0", 100+i)
		add(i%3, id, typ)
		q.order = append(q.order, dlq.Position(id, i%3))
		if typ == "x" {
			q.matchX = append(q.matchX, dlq.Position(id, i%3))
		}
	}
	for _, e := range []struct {
		part int
		id   string
	}{{0, "200-0"}, {2, "200-0"}, {1, "201-0"}} {
		add(e.part, e.id, "x")
		q.order = append(q.order, dlq.Position(e.id, e.part))
		q.matchX = append(q.matchX, dlq.Position(e.id, e.part))
	}
	return q
}

func (q *pq) positions(es []dlq.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = dlq.Position(e.ID, slices.IndexFunc(q.p.Partitions(), func(d *dlq.DLQ) bool { return d.Stream() == e.Stream }))
	}
	return out
}

// left returns the dead letters still in the queue, in its order.
func (q *pq) left(t *testing.T) []string {
	t.Helper()
	es, next, err := q.p.List(context.Background(), dlq.Filter{}, 1000, "")
	if err != nil || next != "" {
		t.Fatalf("List: %v, next %q", err, next)
	}
	return q.positions(es)
}

// TestPartitioned_List: pages of a limit over the whole queue, in the
// queue's order, resumed by their positions, ties included.
func TestPartitioned_List(t *testing.T) {
	t.Parallel()
	q := setupPartitioned(t)
	ctx := context.Background()
	for _, tc := range []struct {
		f    dlq.Filter
		want []string
	}{{dlq.Filter{}, q.order}, {dlq.Filter{Types: []string{"x"}}, q.matchX}} {
		for _, limit := range []int{1, 4, 5, 100} {
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				es, next, err := q.p.List(ctx, tc.f, limit, after)
				if err != nil {
					t.Fatal(err)
				}
				if len(es) > limit {
					t.Fatalf("limit %d: a page of %d", limit, len(es))
				}
				got = append(got, q.positions(es)...)
				if next == "" {
					break
				}
				if pages > 100 {
					t.Fatal("no end")
				}
				after = next
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("filter %v, limit %d: pages give\n%v\nwant\n%v", tc.f.Types, limit, got, tc.want)
			}
		}
	}
	if _, _, err := q.p.List(ctx, dlq.Filter{}, 1, "100-0"); err == nil {
		t.Error("List after a position without a partition: no error")
	}
	if _, _, err := q.p.List(ctx, dlq.Filter{}, 1, "100-0@3"); err == nil {
		t.Error("List after a position in partition 3 of 3: no error")
	}
}

// TestPartitioned_Replay: Limit counts the moves of the whole queue, in
// its order; the next Replay resumes there, and a partition that reached
// its end stays there (a job that died since is not replayed) until the
// queue's replay ends.
func TestPartitioned_Replay(t *testing.T) {
	t.Parallel()
	q := setupPartitioned(t)
	ctx := context.Background()
	f := dlq.Filter{Types: []string{"x"}}

	plan, err := q.p.Replay(ctx, f, dlq.ReplayOptions{DryRun: true, Limit: 4})
	if err != nil || plan.Replayed != 4 {
		t.Fatalf("dry run: %+v, %v; want 4", plan, err)
	}
	res, err := q.p.Replay(ctx, f, dlq.ReplayOptions{Limit: 4})
	if err != nil || res.Replayed != 4 {
		t.Fatalf("Replay Limit 4: %+v, %v", res, err)
	}
	moved := q.matchX[:4]
	if got := q.left(t); !slices.Equal(got, without(q.order, moved)) {
		t.Fatalf("after Limit 4: left %v, want %v", got, without(q.order, moved))
	}
	// Each job is back in the partition it died in.
	for i, s := range q.parts {
		msgs, err := q.rdb.XRange(ctx, s, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if id, _ := m.Values[stream.FieldJobID].(string); id[len(id)-1] != byte('0'+i) {
				t.Errorf("job %s replayed to partition %d", id, i)
			}
		}
	}
	// A job dies in partition 0 after the replay started; the next run
	// reaches partition 0's end (200-0@0) while the queue's replay goes on.
	late := deadJob([]any{"type", "x", "payload", "{}"}, "permanent", "e", time.UnixMilli(1), 1)
	if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.p.Partitions()[0].Stream(), ID: "300-0", Values: late}).Err(); err != nil {
		t.Fatal(err)
	}
	res, err = q.p.Replay(ctx, f, dlq.ReplayOptions{Limit: 3})
	if err != nil || res.Replayed != 3 || !res.Resumed {
		t.Fatalf("second Replay Limit 3: %+v, %v; want 3, resumed", res, err)
	}
	moved = q.matchX[:7]
	if got := q.left(t); !slices.Equal(got, append(without(q.order, moved), "300-0@0")) {
		t.Fatalf("after Limit 3 more: left %v", got)
	}
	res, err = q.p.Replay(ctx, f, dlq.ReplayOptions{})
	if err != nil || res.Replayed != len(q.matchX)-7 || !res.Resumed {
		t.Fatalf("last Replay: %+v, %v; want %d, resumed", res, err, len(q.matchX)-7)
	}
	if got := q.left(t); !slices.Equal(got, append(without(q.order, q.matchX), "300-0@0")) {
		t.Fatalf("after the last replay: left %v", got)
	}
	for _, d := range q.p.Partitions() {
		_, cursor := d.Keys()
		if n, _ := q.rdb.Exists(ctx, cursor).Result(); n != 0 {
			t.Errorf("cursor %s kept after the replay ended", cursor)
		}
	}
	// A new replay takes the job that died meanwhile.
	if res, err = q.p.Replay(ctx, f, dlq.ReplayOptions{}); err != nil || res.Replayed != 1 {
		t.Fatalf("new Replay: %+v, %v; want 1", res, err)
	}
}

// TestPartitioned_ReplayActive: a replay of one partition blocks the
// queue's, which takes no partition's lease then.
func TestPartitioned_ReplayActive(t *testing.T) {
	t.Parallel()
	q := setupPartitioned(t)
	ctx := context.Background()
	d := q.p.Partitions()[1]
	lease, _ := d.Keys()
	if err := q.rdb.Set(ctx, lease, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Fatalf("Replay with partition 1's lease taken: %v, want ErrReplayActive", err)
	}
	for i, d := range q.p.Partitions() {
		lease, _ := d.Keys()
		v, _ := q.rdb.Get(ctx, lease).Result()
		if (i == 1) != (v == "other") || (i != 1 && v != "") {
			t.Errorf("partition %d lease %q after the refused replay", i, v)
		}
	}
	if got := q.left(t); !slices.Equal(got, q.order) {
		t.Errorf("a refused replay moved entries: left %v", got)
	}
}

// TestPartitioned_GetFindJob: an entry found in whichever partition has
// it, by ID or by job ID.
func TestPartitioned_GetFindJob(t *testing.T) {
	t.Parallel()
	q := setupPartitioned(t)
	ctx := context.Background()
	e, err := q.p.Get(ctx, "104-0")
	if err != nil || e.Stream != q.p.Partitions()[1].Stream() {
		t.Fatalf("Get 104-0: %v in %q, want partition 1", err, e.Stream)
	}
	e, err = q.p.FindJob(ctx, "job-108-0-2")
	if err != nil || e.ID != "108-0" || e.Stream != q.p.Partitions()[2].Stream() {
		t.Fatalf("FindJob: %s in %q, %v", e.ID, e.Stream, err)
	}
	if _, err := q.p.Get(ctx, "999-0"); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Get 999-0: %v, want ErrNotFound", err)
	}
	if _, err := q.p.FindJob(ctx, "nope"); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("FindJob nope: %v, want ErrNotFound", err)
	}
	if _, err := dlq.NewPartitioned(q.rdb, "q", 3, dlq.Config{DeadLetterStream: "x"}); err == nil {
		t.Error("NewPartitioned with a DeadLetterStream: no error")
	}
}

func without(all, drop []string) []string {
	return slices.DeleteFunc(slices.Clone(all), func(s string) bool { return slices.Contains(drop, s) })
}
