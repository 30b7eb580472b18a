package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// partitioned returns a dashboard bundle whose queue (b.stream) is a
// partitioned queue of n partitions, and their streams; every key of the
// partitions is deleted at the end.
func partitioned(t *testing.T, n int, cfg dashboard.Config) (*bundle, []string) {
	t.Helper()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	parts, err := stream.Partitions(name, n)
	if err != nil {
		t.Fatal(err)
	}
	del := func() {
		ctx := context.Background()
		for _, p := range parts {
			k, _ := stream.KeysFor(p)
			keys, _ := rdb.Keys(ctx, "{"+strings.Trim(p, "{}")+"}:*").Result()
			rdb.Del(ctx, append(keys, p, k.Dead, k.Paused)...)
		}
	}
	del()
	t.Cleanup(del)
	cfg.Partitions = map[string]int{name: n}
	return setupNamed(t, rdb, name, cfg), parts
}

// xadd adds an entry with the given fields to key (ID "*" unless id).
func xadd(t *testing.T, rdb *redis.Client, key, id string, fields ...any) {
	t.Helper()
	if id == "" {
		id = "*"
	}
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: key, ID: id, Values: fields}).Err(); err != nil {
		t.Fatal(err)
	}
}

func deadFields(typ, source string) []any {
	return []any{"v", "1", "type", typ, "payload", "{}", "job_id", "job-" + typ, "dead_reason", "permanent",
		"dead_error", "boom", "dead_at", "1700000000000", "dead_attempts", "1", "dead_stream", source}
}

// Promise (README "Dashboard"): a queue of Config.Partitions is one row of
// the overview, its figures summed over its partitions, with a
// per-partition breakdown on its page, and its dead letters listed, shown
// and operated across partitions, each entry named by its position.
func TestDashboard_partitionedQueue(t *testing.T) {
	t.Parallel()
	b, parts := partitioned(t, 3, dashboard.Config{PageSize: 2})
	ctx := context.Background()
	// Partition 1 is never written to; 0 and 2 hold 2 and 3 jobs, and one
	// dead letter each with the same entry ID, plus one more in 2.
	for i := range 2 {
		xadd(t, b.rdb, parts[0], "", "v", "1", "type", "a", "n", i)
	}
	for i := range 3 {
		xadd(t, b.rdb, parts[2], "", "v", "1", "type", "b", "n", i)
	}
	k0, _ := stream.KeysFor(parts[0])
	k2, _ := stream.KeysFor(parts[2])
	xadd(t, b.rdb, k0.Dead, "1700000000000-5", deadFields("dead.zero", parts[0])...)
	xadd(t, b.rdb, k2.Dead, "1700000000000-5", deadFields("dead.two", parts[2])...)
	xadd(t, b.rdb, k2.Dead, "1700000000001-0", deadFields("dead.two.more", parts[2])...)

	_, page := b.get("/")
	row := regexp.MustCompile(`(?s)<tr[^>]*>\s*<td><a href="[^"]*">` + regexp.QuoteMeta(b.stream) + `</a>.*?</tr>`).FindString(page)
	if row == "" {
		t.Fatalf("no row for the queue:\n%s", page)
	}
	mustContain(t, row, "3 partitions", `<td class="n">5</td>`, ">3</a>")
	mustNotContain(t, page, parts[0], parts[2])

	_, page = b.get("/queues/" + b.q())
	mustContain(t, page, `id="partitions"`, parts[0], parts[2], parts[1]+` <span class="muted">(never written to)</span>`, "<b>5</b><span>entries</span>")

	// The list: queue order (by ID, equal IDs in partition order), pages
	// of 2 with a position cursor.
	_, page = b.get("/queues/" + b.q() + "/dead")
	mustContain(t, page, "1700000000000-5@0", "1700000000000-5@2", "3 in the dead-letter streams of its 3 partitions")
	mustNotContain(t, page, "dead.two.more")
	next := regexp.MustCompile(`id="next" href="[^"]*after=([^"&]+)"`).FindStringSubmatch(page)
	if next == nil {
		t.Fatalf("no next page:\n%s", page)
	}
	after, _ := url.QueryUnescape(strings.ReplaceAll(next[1], "&amp;", "&"))
	_, page = b.get("/queues/" + b.q() + "/dead?after=" + url.QueryEscape(after))
	mustContain(t, page, "dead.two.more", "1700000000001-0@2")
	mustNotContain(t, page, "dead.zero")

	// One entry, by position: partition 2's, not partition 0's.
	code, page := b.get("/queues/" + b.q() + "/dead/1700000000000-5@2")
	if code != http.StatusOK {
		t.Fatalf("entry page: %d\n%s", code, page)
	}
	mustContain(t, page, "dead.two", parts[2]+":dlq")
	mustNotContain(t, page, "dead.zero")

	// Delete it: partition 0's entry with the same ID stays.
	del := "/queues/" + b.q() + "/dead/1700000000000-5@2/delete"
	if code, page, _ := b.post(del, nil); code != http.StatusOK || !strings.Contains(page, "Delete 1 dead letter") {
		t.Fatalf("delete confirmation: %d\n%s", code, page)
	}
	if code, _, _ := b.post(del, url.Values{"confirm": {"1"}}); code != http.StatusSeeOther {
		t.Fatalf("delete: %d", code)
	}
	if n := b.rdb.XLen(ctx, k2.Dead).Val(); n != 1 {
		t.Errorf("partition 2 holds %d dead letters after the delete, want 1", n)
	}
	if n := b.rdb.XLen(ctx, k0.Dead).Val(); n != 1 {
		t.Errorf("partition 0 holds %d dead letters after deleting partition 2's, want 1", n)
	}

	// Replay every dead letter: each goes back to its own partition.
	path := "/queues/" + b.q() + "/dead/replay"
	if code, page, _ := b.post(path, nil); code != http.StatusOK || !strings.Contains(page, "Replay 2 job(s)") {
		t.Fatalf("replay confirmation: %d\n%s", code, page)
	}
	if code, _, _ := b.post(path, url.Values{"confirm": {"2"}}); code != http.StatusSeeOther {
		t.Fatalf("replay: %d", code)
	}
	eventually(t, "the replay empties both dead-letter streams", func() bool {
		return b.rdb.XLen(ctx, k0.Dead).Val() == 0 && b.rdb.XLen(ctx, k2.Dead).Val() == 0
	})
	if n := b.rdb.XLen(ctx, parts[0]).Val(); n != 3 {
		t.Errorf("partition 0 holds %d entries after the replay, want 3", n)
	}
	if n := b.rdb.XLen(ctx, parts[2]).Val(); n != 4 {
		t.Errorf("partition 2 holds %d entries after the replay, want 4", n)
	}
}

// Promise (README "Dashboard"): each queue's pauses are shown, whole queue
// or types, with their ends, and pause and resume are actions with a
// confirmation; a partitioned queue's act on every partition.
func TestDashboard_pauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, dashboard.Config{})
	t.Cleanup(func() { b.rdb.Del(context.Background(), b.keys.Paused) })
	b.enqueue("t", 1)
	until := time.Now().Add(time.Hour)
	if err := control.Pause(ctx, b.rdb, b.stream, control.PauseOptions{Type: "invoice.send", Until: until}); err != nil {
		t.Fatal(err)
	}
	_, page := b.get("/")
	mustContain(t, page, "1 type(s) paused")
	mustNotContain(t, page, `>paused</span>`)
	_, page = b.get("/queues/" + b.q())
	mustContain(t, page, "type invoice.send", until.UTC().Format("2006-01-02 15:04:05"), `name="type" value="invoice.send"`)

	// Pause the whole queue for 10 minutes.
	path := "/queues/" + b.q() + "/pause"
	code, page, _ := b.post(path, url.Values{"for": {"10m"}})
	if code != http.StatusOK || !strings.Contains(page, "Pause the whole queue") {
		t.Fatalf("pause confirmation: %d\n%s", code, page)
	}
	if st, _ := control.State(ctx, b.rdb, b.stream); st.Queue {
		t.Fatal("the confirmation paused the queue")
	}
	if code, _, loc := b.post(path, url.Values{"for": {"10m"}, "type": {""}, "confirm": {"1"}}); code != http.StatusSeeOther || !strings.Contains(loc, "done=pause") {
		t.Fatalf("pause: %d %s", code, loc)
	}
	st, err := control.State(ctx, b.rdb, b.stream)
	if err != nil || !st.Queue || st.QueueUntil.IsZero() || st.QueueUntil.After(time.Now().Add(11*time.Minute)) {
		t.Fatalf("after the pause: %+v, %v", st, err)
	}
	_, page = b.get("/")
	mustContain(t, page, `>paused</span>`)

	// Resume the type's pause: the queue's stays.
	path = "/queues/" + b.q() + "/resume"
	if code, page, _ := b.post(path, url.Values{"type": {"invoice.send"}}); code != http.StatusOK || !strings.Contains(page, "Lift the pause of type") {
		t.Fatalf("resume confirmation: %d\n%s", code, page)
	}
	if code, _, _ := b.post(path, url.Values{"type": {"invoice.send"}, "confirm": {"1"}}); code != http.StatusSeeOther {
		t.Fatalf("resume: %d", code)
	}
	if st, _ := control.State(ctx, b.rdb, b.stream); !st.Queue || len(st.Types) != 0 {
		t.Fatalf("after resuming the type: %+v", st)
	}
	// Bad options are refused before Redis is touched.
	if code, _, _ := b.post("/queues/"+b.q()+"/pause", url.Values{"for": {"-1m"}, "confirm": {"1"}}); code != http.StatusBadRequest {
		t.Errorf("pause for -1m: %d, want 400", code)
	}
}

func TestDashboard_pausePartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, parts := partitioned(t, 3, dashboard.Config{})
	xadd(t, b.rdb, parts[1], "", "v", "1", "type", "a")
	path := "/queues/" + b.q() + "/pause"
	if code, page, _ := b.post(path, url.Values{"type": {"a"}}); code != http.StatusOK || !strings.Contains(page, "on its 3 partitions") {
		t.Fatalf("pause confirmation: %d\n%s", code, page)
	}
	if code, _, _ := b.post(path, url.Values{"type": {"a"}, "confirm": {"3"}}); code != http.StatusSeeOther {
		t.Fatalf("pause: %d", code)
	}
	for i, p := range parts {
		if st, err := control.State(ctx, b.rdb, p); err != nil || len(st.Types) != 1 {
			t.Errorf("partition %d after the pause: %+v, %v", i, st, err)
		}
	}
	_, page := b.get("/queues/" + b.q())
	mustContain(t, page, "type a", "3 of 3")
	if err := control.Resume(ctx, b.rdb, parts[0], control.ResumeOptions{Type: "a"}); err != nil {
		t.Fatal(err)
	}
	_, page = b.get("/queues/" + b.q())
	mustContain(t, page, "2 of 3")
}

// Promise (package doc): read-only refuses every POST; the pause and
// resume actions are POSTs like the others.
func TestDashboard_pauseReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, dashboard.Config{ReadOnly: true})
	t.Cleanup(func() { b.rdb.Del(context.Background(), b.keys.Paused) })
	b.enqueue("t", 1)
	_, page := b.get("/queues/" + b.q())
	mustNotContain(t, page, "pause-btn", "/pause")
	for _, p := range []string{"/pause", "/resume"} {
		if code, _, _ := b.post("/queues/"+b.q()+p, url.Values{"confirm": {"1"}, "all": {"1"}}); code != http.StatusForbidden {
			t.Errorf("POST %s on a read-only dashboard: %d, want 403", p, code)
		}
	}
	if st, _ := control.State(ctx, b.rdb, b.stream); st.Any() {
		t.Errorf("a read-only dashboard paused: %+v", st)
	}
}

// A pause hash that Pelican did not write (a hostile key) is escaped and
// cut, offers no resume it would refuse, and is not read when huge.
func TestDashboard_pausesHostile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, dashboard.Config{MaxValueBytes: 100})
	t.Cleanup(func() { b.rdb.Del(context.Background(), b.keys.Paused) })
	b.enqueue("t", 1)
	long := "<script>alert(1)</script>" + strings.Repeat("x", 10000)
	b.rdb.HSet(ctx, b.keys.Paused, "type:"+long, "0")
	_, page := b.get("/queues/" + b.q())
	mustNotContain(t, page, "<script>alert", strings.Repeat("x", 200))
	mustContain(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;", "(cut: ")
	if strings.Contains(page, "resume-btn") {
		t.Error("a resume button for a type Resume refuses")
	}
	fields := make([]any, 0, 2*(control.MaxPauses*2+1))
	for i := range control.MaxPauses*2 + 1 {
		fields = append(fields, "type:t"+strings.Repeat("y", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), "0")
	}
	b.rdb.HSet(ctx, b.keys.Paused, fields...)
	_, page = b.get("/")
	mustContain(t, page, "more than Pelican writes: not read")
}
