package dlq_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// The tests run against the real Redis at REDIS_ADDR (redistest.Shared):
// Replay's scripts and XRANGE paging are what they check, and each test
// keeps to streams of its own.

type bundle struct {
	rdb    *redis.Client
	source string
	dead   string
	lease  string
	cursor string
}

func setup(t *testing.T, cfg dlq.Config) (*dlq.DLQ, *bundle) {
	t.Helper()
	rdb := redistest.Shared(t)
	source := redistest.Name(t)
	d, err := dlq.New(rdb, source, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{rdb: rdb, source: source, dead: d.Stream()}
	b.lease, b.cursor = d.Keys()
	t.Cleanup(func() { rdb.Del(context.Background(), b.source, b.dead, b.lease, b.cursor) })
	return d, b
}

// deadJob returns the fields of a dead-letter entry as consumer/dead.lua
// writes them: the job's fields, then the dead_* fields.
func deadJob(jobFields []any, reason, errText string, at time.Time, attempts int) []any {
	f := slices.Clone(jobFields)
	return append(f, "dead_reason", reason, "dead_error", errText, "dead_at", strconv.FormatInt(at.UnixMilli(), 10),
		"dead_attempts", strconv.Itoa(attempts), "dead_consumer", "c1", "dead_entry_id", "1700000000000-7", "dead_stream", "jobs")
}

// add XADDs fields to the dead-letter stream and returns the entry ID.
func (b *bundle) add(t *testing.T, fields []any) string {
	t.Helper()
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.dead, Values: fields}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *bundle) len(t *testing.T, key string) int64 {
	t.Helper()
	n, err := b.rdb.XLen(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func ids(es []dlq.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

func TestNew(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { rdb.Close() })
	d, err := dlq.New(rdb, "orders", dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lease, cursor := d.Keys()
	if d.Stream() != "{orders}:dlq" || lease != "{orders}:dlq:replay" || cursor != "{orders}:dlq:replay:cursor" {
		t.Errorf("keys: %q %q %q", d.Stream(), lease, cursor)
	}
	for _, tc := range []struct {
		source string
		cfg    dlq.Config
		want   string
	}{
		{"orders", dlq.Config{DeadLetterStream: "orders-dead"}, "Config.DeadLetterStream"},
		{"orders", dlq.Config{DeadLetterStream: "orders"}, "must differ"},
		{"orders}", dlq.Config{}, "braces"},
		{"orders", dlq.Config{LeaseTTL: -time.Second}, "Config.LeaseTTL"},
		{"orders", dlq.Config{LeaseTTL: time.Millisecond}, "Config.LeaseTTL"},
		{"orders", dlq.Config{CursorTTL: -1}, "Config.CursorTTL"},
		{"orders", dlq.Config{PageSize: -1}, "Config.PageSize"},
	} {
		if _, err := dlq.New(rdb, tc.source, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q, %+v) = %v, want an error naming %s", tc.source, tc.cfg, err, tc.want)
		}
	}
	if _, err := dlq.New(rdb, "orders", dlq.Config{DeadLetterStream: "{orders}:dead"}); err != nil {
		t.Errorf("a dead-letter stream with the source's hash tag: %v", err)
	}
}

// filterFixture dead-letters four jobs an hour apart and returns their IDs
// and the time of the first.
func filterFixture(t *testing.T, b *bundle) (a, bb, c, m string, t0 time.Time) {
	t0 = time.UnixMilli(1_800_000_000_000)
	a = b.add(t, deadJob([]any{"type", "email", "payload", "{}"}, "exhausted", "smtp timeout", t0, 5))
	bb = b.add(t, deadJob([]any{"type", "email", "payload", "{}"}, "permanent", "bad address", t0.Add(time.Hour), 1))
	c = b.add(t, deadJob([]any{"type", "sms", "payload", "{}"}, "exhausted", "gateway timeout", t0.Add(2*time.Hour), 5))
	m = b.add(t, deadJob([]any{"payload", "x"}, "malformed", `stream: entry 1-0: field "type": is missing`, t0.Add(3*time.Hour), 1))
	return
}

func TestDLQ_List(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	a, bb, c, m, t0 := filterFixture(t, b)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		f    dlq.Filter
		want []string
	}{
		{"all", dlq.Filter{}, []string{a, bb, c, m}},
		{"type", dlq.Filter{Types: []string{"email"}}, []string{a, bb}},
		{"types", dlq.Filter{Types: []string{"sms", "nope"}}, []string{c}},
		{"reason", dlq.Filter{Reasons: []string{"exhausted"}}, []string{a, c}},
		{"reasons", dlq.Filter{Reasons: []string{"malformed", "permanent"}}, []string{bb, m}},
		{"since", dlq.Filter{Since: t0.Add(time.Hour)}, []string{bb, c, m}},
		{"until", dlq.Filter{Until: t0.Add(2 * time.Hour)}, []string{a, bb}},
		{"since until", dlq.Filter{Since: t0.Add(time.Hour), Until: t0.Add(2 * time.Hour)}, []string{bb}},
		{"error", dlq.Filter{ErrorContains: "timeout"}, []string{a, c}},
		{"error case-sensitive", dlq.Filter{ErrorContains: "Timeout"}, nil},
		{"ids", dlq.Filter{IDs: []string{c, a, "1-1"}}, []string{a, c}},
		{"type and reason", dlq.Filter{Types: []string{"email"}, Reasons: []string{"exhausted"}}, []string{a}},
		{"types error since", dlq.Filter{Types: []string{"email", "sms"}, ErrorContains: "timeout", Since: t0.Add(time.Minute)}, []string{c}},
		{"ids and reason", dlq.Filter{IDs: []string{a, bb}, Reasons: []string{"permanent"}}, []string{bb}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := d.List(ctx, tc.f, 0, "")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), tc.want) || next != "" {
				t.Errorf("List = %v, next %q; want %v, next \"\"", ids(got), next, tc.want)
			}
			n, err := d.Count(ctx, tc.f)
			if err != nil || n != len(tc.want) {
				t.Errorf("Count = %d, %v; want %d", n, err, len(tc.want))
			}
		})
	}
	for _, f := range []dlq.Filter{{IDs: []string{"x"}}, {Since: t0, Until: t0}} {
		if _, _, err := d.List(ctx, f, 0, ""); err == nil {
			t.Errorf("List(%+v) succeeded, want an error", f)
		}
	}
}

func TestDLQ_ListPaging(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{PageSize: 7})
	var all, odd []string
	for i := range 25 {
		typ := "even"
		if i%2 == 1 {
			typ = "odd"
		}
		id := b.add(t, deadJob([]any{"type", typ}, "exhausted", "e", time.Now(), 1))
		all = append(all, id)
		if typ == "odd" {
			odd = append(odd, id)
		}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		f     dlq.Filter
		limit int
		want  []string
	}{
		{dlq.Filter{}, 10, all},
		{dlq.Filter{Types: []string{"odd"}}, 5, odd},
		{dlq.Filter{Types: []string{"odd"}}, 12, odd},
		{dlq.Filter{IDs: all[3:20]}, 4, all[3:20]},
	} {
		var got []string
		after, pages := "", 0
		for {
			es, next, err := d.List(ctx, tc.f, tc.limit, after)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) > tc.limit {
				t.Fatalf("a page of %d entries, limit %d", len(es), tc.limit)
			}
			pages++
			got = append(got, ids(es)...)
			if next == "" {
				break
			}
			if next != es[len(es)-1].ID {
				t.Fatalf("next = %q, want the page's last ID %q", next, es[len(es)-1].ID)
			}
			after = next
		}
		wantPages := (len(tc.want) + tc.limit - 1) / tc.limit
		if !slices.Equal(got, tc.want) || pages != wantPages {
			t.Errorf("filter %+v limit %d: %d pages %v, want %d pages %v", tc.f, tc.limit, pages, got, wantPages, tc.want)
		}
	}
}

func TestDLQ_Get(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{})
	ctx := context.Background()
	at := time.UnixMilli(1_800_000_000_123)
	job := []any{"v", "1", "type", "email", "payload", `{"to":"a"}`, "job_id", "J1", "idempotency_key", "IK1",
		"attempt", "4", "h.tenant", "acme", "origin", "cron", "origin", "cron2"}
	id := b.add(t, deadJob(job, "exhausted", "boom", at, 5))
	e, err := d.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range e.Fields {
		names = append(names, f.Name)
	}
	want := []string{"v", "type", "payload", "job_id", "idempotency_key", "attempt", "h.tenant", "origin", "origin",
		"dead_reason", "dead_error", "dead_at", "dead_attempts", "dead_consumer", "dead_entry_id", "dead_stream"}
	if !slices.Equal(names, want) {
		t.Errorf("field names %v, want %v", names, want)
	}
	if e.Reason != "exhausted" || e.Error != "boom" || !e.DeadAt.Equal(at) || e.Attempts != 5 || e.Consumer != "c1" ||
		e.SourceEntryID != "1700000000000-7" || e.SourceStream != "jobs" {
		t.Errorf("entry metadata: %+v", e)
	}
	if e.Job == nil {
		t.Fatalf("Job nil: %v", e.DecodeErr)
	}
	if e.Job.ID != "J1" || e.Job.IdempotencyKey != "IK1" || e.Job.Attempt != 4 || e.Job.Headers["tenant"] != "acme" ||
		e.Job.Extra["origin"] != "cron2" || len(e.Job.Extra) != 1 || e.Job.EntryID != "1700000000000-7" {
		t.Errorf("Job: %+v", e.Job)
	}

	mid := b.add(t, deadJob([]any{"payload", "x"}, "malformed", "no type", at, 1))
	m, err := d.Get(ctx, mid)
	if err != nil {
		t.Fatal(err)
	}
	var de *stream.DecodeError
	if m.Job != nil || !errors.As(m.DecodeErr, &de) || de.Field != "type" {
		t.Errorf("malformed entry: Job %+v, DecodeErr %v", m.Job, m.DecodeErr)
	}

	if _, err := d.Get(ctx, "1-1"); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Get of a missing ID: %v, want ErrNotFound", err)
	}
	if _, err := d.Get(ctx, "nope"); err == nil || errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Get of an invalid ID: %v, want an invalid-ID error", err)
	}
}

func TestDLQ_Purge(t *testing.T) {
	t.Parallel()
	d, b := setup(t, dlq.Config{PageSize: 3})
	ctx := context.Background()
	var keep []string
	for i := range 20 {
		reason := "exhausted"
		if i%4 == 0 {
			reason = "malformed"
		}
		id := b.add(t, deadJob([]any{"type", "t"}, reason, "e", time.Now(), 1))
		if reason != "malformed" {
			keep = append(keep, id)
		}
	}
	f := dlq.Filter{Reasons: []string{"malformed"}}
	before, _ := b.rdb.XRange(ctx, b.dead, "-", "+").Result()
	n, err := d.Purge(ctx, f, dlq.PurgeOptions{DryRun: true})
	if err != nil || n != 5 {
		t.Fatalf("dry-run Purge = %d, %v; want 5", n, err)
	}
	after, _ := b.rdb.XRange(ctx, b.dead, "-", "+").Result()
	if len(before) != 20 || len(after) != 20 {
		t.Fatalf("dry run changed the stream: %d entries before, %d after", len(before), len(after))
	}
	var reports []int
	n, err = d.Purge(ctx, f, dlq.PurgeOptions{Progress: func(d int) { reports = append(reports, d) }})
	if err != nil || n != 5 {
		t.Fatalf("Purge = %d, %v; want 5", n, err)
	}
	if len(reports) == 0 || reports[len(reports)-1] != 5 {
		t.Errorf("progress reports %v, want the last to be 5", reports)
	}
	left, _, err := d.List(ctx, dlq.Filter{}, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(left), keep) {
		t.Errorf("left %v, want %v", ids(left), keep)
	}
}
