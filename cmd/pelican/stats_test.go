package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// queue is a prepared stream on the shared test Redis.
type queue struct {
	rdb  *redis.Client
	name string
	keys stream.Keys
	ids  []string
}

// setupQueue makes a stream with 5 jobs, group "g" that read 3 of them
// (consumer c1 holds 2 pending, c2 acknowledged 1), 2 delayed jobs and 3
// dead letters (2 panic, 1 crashed). It deletes its keys when t ends.
func setupQueue(t *testing.T) *queue {
	t.Helper()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	q := &queue{rdb: rdb, name: redistest.Name(t)}
	var err error
	if q.keys, err = stream.KeysFor(q.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), q.keys.Stream, q.keys.Dead, q.keys.Delayed) })
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: q.name})
	for range 5 {
		j, err := stream.NewJSONJob("email", map[string]int{"n": 1})
		if err != nil {
			t.Fatal(err)
		}
		id, err := p.Enqueue(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		q.ids = append(q.ids, id)
	}
	must(t, rdb.XGroupCreate(ctx, q.name, "g", "0").Err())
	must(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{q.name, ">"}, Count: 2}).Err())
	must(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c2", Streams: []string{q.name, ">"}, Count: 1}).Err())
	must(t, rdb.XAck(ctx, q.name, "g", q.ids[2]).Err())
	for range 2 {
		j, _ := stream.NewJSONJob("report", map[string]int{})
		must(t, p.EnqueueIn(ctx, j, 3600e9))
	}
	for _, r := range []string{"panic", "panic", "crashed"} {
		must(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.keys.Dead, Values: []any{"type", "email", "dead_reason", r}}).Err())
	}
	return q
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestStats_table(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	out, errOut, code := runCLI(t, nil, "", "stats", q.name)
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	wantRows := [][]string{
		{q.name, "5", "2", "3"},          // stream, length, delayed, dead
		{"g", "2", "2", q.ids[0]},        // group, pending, lag, oldest pending
		{"g", "c1", "2"},                 // consumer row (idle in between)
		{"crashed", "1"}, {"panic", "2"}, // dead reasons
	}
	for _, want := range wantRows {
		if !hasRow(lines, want) {
			t.Errorf("no row with %q in:\n%s", want, out)
		}
	}
}

// hasRow reports whether some line has all of cells as fields, in order.
func hasRow(lines []string, cells []string) bool {
	for _, l := range lines {
		f := strings.Fields(l)
		i := 0
		for _, x := range f {
			if i < len(cells) && x == cells[i] {
				i++
			}
		}
		if i == len(cells) {
			return true
		}
	}
	return false
}

func TestStats_json(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	out, errOut, code := runCLI(t, nil, "", "stats", q.name, "--output", "json")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	var got []struct {
		Stream       string           `json:"stream"`
		Length       int64            `json:"length"`
		Delayed      int64            `json:"delayed"`
		DeadLetters  int64            `json:"dead_letters"`
		DeadByReason map[string]int64 `json:"dead_by_reason"`
		Groups       []struct {
			Name            string `json:"name"`
			Pending         int64  `json:"pending"`
			Lag             *int64 `json:"lag"`
			OldestPendingID string `json:"oldest_pending_id"`
			Consumers       []struct {
				Name    string `json:"name"`
				Pending int64  `json:"pending"`
			} `json:"consumers"`
		} `json:"groups"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bad json %v:\n%s", err, out)
	}
	if len(got) != 1 {
		t.Fatalf("got %d streams, want 1", len(got))
	}
	s := got[0]
	if s.Stream != q.name || s.Length != 5 || s.Delayed != 2 || s.DeadLetters != 3 ||
		s.DeadByReason["panic"] != 2 || s.DeadByReason["crashed"] != 1 {
		t.Errorf("stream stats = %+v", s)
	}
	if len(s.Groups) != 1 {
		t.Fatalf("groups = %+v", s.Groups)
	}
	g := s.Groups[0]
	if g.Name != "g" || g.Pending != 2 || g.Lag == nil || *g.Lag != 2 || g.OldestPendingID != q.ids[0] || len(g.Consumers) != 2 {
		t.Errorf("group = %+v", g)
	}
	pend := map[string]int64{}
	for _, c := range g.Consumers {
		pend[c.Name] = c.Pending
	}
	if pend["c1"] != 2 || pend["c2"] != 0 {
		t.Errorf("consumers pending = %v, want c1:2 c2:0", pend)
	}
}

func TestStats_allStreams(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	out, errOut, code := runCLI(t, nil, "", "stats", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	var got []struct {
		Stream string `json:"stream"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bad json %v:\n%s", err, out)
	}
	var found bool
	for _, s := range got {
		if s.Stream == q.name {
			found = true
		}
		if strings.HasSuffix(s.Stream, ":dlq") {
			t.Errorf("dead-letter stream %s listed", s.Stream)
		}
	}
	if !found {
		t.Errorf("%s not listed in %s", q.name, out)
	}
}

func TestStats_errors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	str := redistest.Name(t)
	must(t, rdb.Set(ctx, str, "x", 0).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), str) })

	tests := []struct {
		name    string
		args    []string
		code    int
		message string
	}{
		{"unknown stream", []string{"stats", str + ":missing"}, exitNotFound, "unknown stream"},
		{"wrong key type", []string{"stats", str}, exitError, "wrong key type"},
		{"bad output", []string{"stats", "-o", "yaml"}, exitUsage, "invalid --output"},
		{"bad watch", []string{"stats", "--watch=soon"}, exitUsage, "invalid argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, errOut, code := runCLI(t, nil, "", tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.message) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", code, errOut, tt.code, tt.message)
			}
		})
	}
}

func TestStats_watch(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	out, errOut, code := runCLI(t, nil, "", "stats", q.name, "--watch=10ms", "--watch-count", "3")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	if n := strings.Count(out, "\x1b[H\x1b[2J"); n != 3 {
		t.Errorf("%d screen clears, want 3:\n%q", n, out)
	}
}

func TestStats_cluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	cc := c.Client(t)
	name := "{orders}:jobs"
	p := stream.NewProducer(cc, stream.ProducerConfig{Stream: name})
	for range 3 {
		j, _ := stream.NewJSONJob("email", 1)
		if _, err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	must(t, cc.XGroupCreate(ctx, name, "g", "0").Err())
	must(t, cc.XAdd(ctx, &redis.XAddArgs{Stream: "{orders}:jobs:dlq", Values: []any{"dead_reason", "panic"}}).Err())
	url := "redis+cluster://" + strings.Join(c.Addrs(), ",") + "/"
	for _, args := range [][]string{{"stats", name, "-o", "json"}, {"stats", "-o", "json"}} {
		out, errOut, code := runCLI(t, []string{"REDIS_URL=" + url}, "", args...)
		if code != 0 {
			t.Fatalf("%v: exit %d, stderr: %s", args, code, errOut)
		}
		var got []streamStats
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("bad json %v:\n%s", err, out)
		}
		if len(got) != 1 || got[0].Stream != name || got[0].Length != 3 || got[0].DeadByReason["panic"] != 1 || len(got[0].Groups) != 1 {
			t.Errorf("%v: got %s", args, out)
		}
	}
}

// TestStats_forbiddenStreams: under an ACL limited to one team's keys, stats
// without arguments shows that team's streams, skips the others (NOPERM)
// without naming them, and a user that may not SCAN is told to name its
// streams; neither fails.
func TestStats_forbiddenStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Options{})
	admin := srv.Client(t)
	for _, s := range []string{"orders", "secret-payroll", "{secret-hr}:jobs"} {
		must(t, admin.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "t"}}).Err())
		must(t, admin.XGroupCreate(ctx, s, "g", "0").Err())
	}
	must(t, admin.XAdd(ctx, &redis.XAddArgs{Stream: "{orders}:dlq", Values: []any{"dead_reason", "panic"}}).Err())
	read := []any{"~orders", "~{orders}:*", "+ping", "+type", "+time", "+xlen", "+zcard", "+xinfo|groups",
		"+xinfo|consumers", "+xpending", "+xrange"}
	must(t, admin.Do(ctx, append([]any{"ACL", "SETUSER", "ops", "on", ">pw", "+scan"}, read...)...).Err())
	must(t, admin.Do(ctx, append([]any{"ACL", "SETUSER", "noscan", "on", ">pw"}, read...)...).Err())
	url := func(user string) []string { return []string{"REDIS_URL=redis://" + user + ":pw@" + srv.Addr() + "/0"} }

	for _, output := range []string{"table", "json"} {
		out, errOut, code := runCLI(t, url("ops"), "", "stats", "--output", output)
		if code != 0 || !strings.Contains(out, "orders") || !strings.Contains(out, "panic") ||
			!strings.Contains(errOut, "skipped 2 stream(s) that this Redis user may not read") {
			t.Fatalf("stats (%s) as ops: exit %d\nstdout:\n%s\nstderr:\n%s", output, code, out, errOut)
		}
		if strings.Contains(out+errOut, "secret") || strings.Contains(out+errOut, "NOPERM") {
			t.Fatalf("stats (%s) as ops names another team's stream or its error:\n%s\n%s", output, out, errOut)
		}
	}

	out, errOut, code := runCLI(t, url("noscan"), "", "stats")
	if code != 0 || !strings.Contains(errOut, "may not run SCAN") || !strings.Contains(out, "no streams") {
		t.Fatalf("stats as noscan: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, url("noscan"), "", "stats", "orders"); code != 0 || !strings.Contains(out, "orders") {
		t.Fatalf("stats orders as noscan: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
