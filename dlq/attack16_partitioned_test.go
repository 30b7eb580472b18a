package dlq_test

// Outside tests (attack16): dlq.Partitioned treats a partitioned queue's dead
// letters as one. Written from the package documentation and godoc only.
// They run on the shared Redis, each under its own queue name.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

type a16p struct {
	rdb   *redis.Client
	queue string
	p     *dlq.Partitioned
	parts []*dlq.DLQ
}

func a16pNew(t *testing.T, n int, cfg dlq.Config) *a16p {
	t.Helper()
	rdb := redistest.Shared(t)
	queue := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, "{"+queue+"~*") })
	p, err := dlq.NewPartitioned(rdb, queue, n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.Partitions()); got != n {
		t.Fatalf("Partitions(): %d, want %d", got, n)
	}
	return &a16p{rdb: rdb, queue: queue, p: p, parts: p.Partitions()}
}

// add writes a dead letter as consumer/dead.lua would, with the given entry
// ID ("*" for an automatic one); the job ID is "<tag>".
func (q *a16p) add(t *testing.T, part int, id, jobID, typ string, extra ...any) string {
	t.Helper()
	d := q.parts[part]
	vals := []any{"type", typ, "payload", "{}", "job_id", jobID, "attempt", "3",
		"dead_reason", "permanent", "dead_error", "boom", "dead_attempts", "4", "dead_stream", d.Source()}
	vals = append(vals, extra...)
	got, err := q.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: d.Stream(), ID: id, Values: vals}).Result()
	if err != nil {
		t.Fatalf("XADD %s %s: %v", d.Stream(), id, err)
	}
	return got
}

func (q *a16p) partOf(t *testing.T, e dlq.Entry) int {
	t.Helper()
	for i, d := range q.parts {
		if d.Stream() == e.Stream {
			return i
		}
	}
	t.Fatalf("entry %s: Stream %q is none of the partitions' dead-letter streams", e.ID, e.Stream)
	return -1
}

// sources maps each job ID in the source streams to the partitions holding it
// (one element per copy).
func (q *a16p) sources(t *testing.T) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for i, d := range q.parts {
		msgs, err := q.rdb.XRange(context.Background(), d.Source(), "-", "+").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("XRANGE %s: %v", d.Source(), err)
		}
		for _, m := range msgs {
			id, _ := m.Values["job_id"].(string)
			out[id] = append(out[id], i)
		}
	}
	return out
}

// dead maps each job ID still dead to its partitions.
func (q *a16p) dead(t *testing.T) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for i, d := range q.parts {
		msgs, err := q.rdb.XRange(context.Background(), d.Stream(), "-", "+").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("XRANGE %s: %v", d.Stream(), err)
		}
		for _, m := range msgs {
			id, _ := m.Values["job_id"].(string)
			out[id] = append(out[id], i)
		}
	}
	return out
}

type a16pos struct {
	ms, seq uint64
	part    int
	job     string
}

func a16parseID(t *testing.T, id string) (uint64, uint64) {
	t.Helper()
	a, b, ok := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("bad entry ID %q", id)
	}
	return ms, seq
}

func a16sort(s []a16pos) {
	sort.Slice(s, func(i, j int) bool {
		a, b := s[i], s[j]
		if a.ms != b.ms {
			return a.ms < b.ms
		}
		if a.seq != b.seq {
			return a.seq < b.seq
		}
		return a.part < b.part
	})
}

// a16fill writes entries with many ties: each of the IDs (ms 1..msN, seq 0..1)
// goes to a random subset of partitions. It returns them in the queue's order.
func a16fill(t *testing.T, q *a16p, seed int64, msN int) []a16pos {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	var want []a16pos
	for ms := 1; ms <= msN; ms++ {
		for seq := 0; seq <= 1; seq++ {
			for part := range q.parts {
				if r.Intn(3) == 0 {
					continue
				}
				job := fmt.Sprintf("j-%d-%d-%d", ms, seq, part)
				typ := "a"
				if r.Intn(2) == 0 {
					typ = "b"
				}
				q.add(t, part, fmt.Sprintf("%d-%d", ms, seq), job, typ)
				want = append(want, a16pos{uint64(ms), uint64(seq), part, job})
			}
		}
	}
	a16sort(want)
	return want
}

// a16page lists the whole queue with pages of limit, failing on a page loop.
func a16page(t *testing.T, q *a16p, f dlq.Filter, limit int, between func(page int, entries []dlq.Entry)) []a16pos {
	t.Helper()
	var got []a16pos
	after := ""
	for page := 0; ; page++ {
		if page > 10000 {
			t.Fatalf("List with limit %d: more than 10000 pages, after %q", limit, after)
		}
		entries, next, err := q.p.List(context.Background(), f, limit, after)
		if err != nil {
			t.Fatalf("List(limit %d, after %q): %v", limit, after, err)
		}
		if len(entries) > limit {
			t.Fatalf("List(limit %d, after %q): %d entries", limit, after, len(entries))
		}
		for _, e := range entries {
			ms, seq := a16parseID(t, e.ID)
			job := ""
			if e.Job != nil {
				job = e.Job.ID
			}
			got = append(got, a16pos{ms, seq, q.partOf(t, e), job})
		}
		if next == "" {
			return got
		}
		if len(entries) == 0 {
			t.Fatalf("List(limit %d, after %q): an empty page with next %q", limit, after, next)
		}
		if between != nil {
			between(page, entries)
		}
		after = next
	}
}

// TestAttack16Part_listPagesWithTies: the same entry IDs in several
// partitions; paging with every limit from 1 to 7 returns each entry once,
// in the documented order (by ID, equal IDs in partition order), filtered
// or not.
func TestAttack16Part_listPagesWithTies(t *testing.T) {
	q := a16pNew(t, 5, dlq.Config{PageSize: 3})
	want := a16fill(t, q, 16, 9)
	var wantA []a16pos
	for _, w := range want {
		msgs, _ := q.rdb.XRange(context.Background(), q.parts[w.part].Stream(), fmt.Sprintf("%d-%d", w.ms, w.seq), fmt.Sprintf("%d-%d", w.ms, w.seq)).Result()
		if len(msgs) == 1 && msgs[0].Values["type"] == "a" {
			wantA = append(wantA, w)
		}
	}
	for limit := 1; limit <= 7; limit++ {
		if got := a16page(t, q, dlq.Filter{}, limit, nil); !slices.Equal(got, want) {
			t.Errorf("limit %d: pages give\n%v\nwant\n%v", limit, got, want)
		}
		if got := a16page(t, q, dlq.Filter{Types: []string{"a"}}, limit, nil); !slices.Equal(got, wantA) {
			t.Errorf("limit %d, type a: pages give\n%v\nwant\n%v", limit, got, wantA)
		}
	}
	n, err := q.p.Count(context.Background(), dlq.Filter{})
	if err != nil || n != len(want) {
		t.Errorf("Count: %d, %v; want %d", n, err, len(want))
	}
	n, err = q.p.Count(context.Background(), dlq.Filter{Types: []string{"a"}})
	if err != nil || n != len(wantA) {
		t.Errorf("Count(type a): %d, %v; want %d", n, err, len(wantA))
	}
	// A position names an entry; the page after it follows the doc's rule
	// even when that entry is not there (any ID, any partition).
	for _, pos := range []struct {
		ms, seq uint64
		part    int
	}{{3, 0, 0}, {3, 0, 4}, {3, 1, 2}, {0, 0, 0}, {100, 0, 0}, {5, 7, 3}} {
		after := dlq.Position(fmt.Sprintf("%d-%d", pos.ms, pos.seq), pos.part)
		entries, _, err := q.p.List(context.Background(), dlq.Filter{}, 1000, after)
		if err != nil {
			t.Fatalf("List after %s: %v", after, err)
		}
		var exp []a16pos
		for _, w := range want {
			gt := w.ms > pos.ms || w.ms == pos.ms && w.seq > pos.seq
			eq := w.ms == pos.ms && w.seq == pos.seq
			if gt || eq && w.part > pos.part {
				exp = append(exp, w)
			}
		}
		var got []a16pos
		for _, e := range entries {
			ms, seq := a16parseID(t, e.ID)
			got = append(got, a16pos{ms, seq, q.partOf(t, e), e.Job.ID})
		}
		if !slices.Equal(got, exp) {
			t.Errorf("List after %s:\n%v\nwant\n%v", after, got, exp)
		}
	}
}

// TestAttack16Part_listEntriesChangeBetweenPages: entries added between
// pages (later IDs, in partitions before and after the position, and with
// the position's own ID in later partitions) each appear once; the entry a
// position names being deleted before the next page loses nothing.
func TestAttack16Part_listEntriesChangeBetweenPages(t *testing.T) {
	q := a16pNew(t, 4, dlq.Config{PageSize: 2})
	want := a16fill(t, q, 7, 6)
	added := 0
	got := a16page(t, q, dlq.Filter{}, 2, func(page int, entries []dlq.Entry) {
		if page >= 15 {
			return
		}
		last := entries[len(entries)-1]
		lp := q.partOf(t, last)
		ms, seq := a16parseID(t, last.ID)
		// Later ID in every partition, and automatic IDs (now) too.
		for part := range q.parts {
			job := fmt.Sprintf("add-%d-%d", page, part)
			id := fmt.Sprintf("%d-%d", ms, seq+100+uint64(page))
			if _, err := q.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: q.parts[part].Stream(), ID: id,
				Values: []any{"type", "a", "payload", "{}", "job_id", job, "dead_reason", "permanent"}}).Result(); err == nil {
				want = append(want, a16pos{ms, seq + 100 + uint64(page), part, job})
				added++
			}
			if page%3 == 0 {
				job := fmt.Sprintf("auto-%d-%d", page, part)
				id := q.add(t, part, "*", job, "b")
				ams, aseq := a16parseID(t, id)
				want = append(want, a16pos{ams, aseq, part, job})
				added++
			}
		}
		// The position's own ID in a later partition, when free there.
		if lp+1 < len(q.parts) {
			job := fmt.Sprintf("tie-%d", page)
			if _, err := q.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: q.parts[lp+1].Stream(), ID: last.ID,
				Values: []any{"type", "a", "payload", "{}", "job_id", job, "dead_reason", "permanent"}}).Result(); err == nil {
				want = append(want, a16pos{ms, seq, lp + 1, job})
				added++
			}
		}
		// Delete the entry the position names (replayed or purged meanwhile).
		if page%2 == 1 {
			if err := q.rdb.XDel(context.Background(), q.parts[lp].Stream(), last.ID).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	a16sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("pages give %d entries\n%v\nwant %d (%d added between pages)\n%v", len(got), got, len(want), added, want)
	}
}

// TestAttack16Part_positions: Position and ParsePosition round-trip; a
// malformed position is an error, for ParsePosition and for List.
func TestAttack16Part_positions(t *testing.T) {
	for _, c := range []struct {
		id   string
		part int
	}{{"0-0", 0}, {"1700000000000-0", 3}, {"18446744073709551615-18446744073709551615", 1023}, {"5-1", 11}} {
		pos := dlq.Position(c.id, c.part)
		id, part, err := dlq.ParsePosition(pos)
		if err != nil || id != c.id || part != c.part {
			t.Errorf("ParsePosition(Position(%q, %d) = %q) = %q, %d, %v", c.id, c.part, pos, id, part, err)
		}
	}
	if pos := dlq.Position("1700000000000-0", 3); pos != "1700000000000-0@3" {
		t.Errorf("Position = %q, want the documented 1700000000000-0@3", pos)
	}
	bad := []string{"", "@", "1-0", "1-0@", "@1", "1-0@x", "1-0@-1", "1-0@1@2", "x-0@1", "1-0 @1", "1-0@1 ",
		"1-0@1024", "1-0@99999999999999999999", "18446744073709551616-0@0", "1-x@0", "-1-0@0"}
	for _, s := range bad {
		if id, part, err := dlq.ParsePosition(s); err == nil {
			t.Errorf("ParsePosition(%q) = %q, %d, nil; want an error", s, id, part)
		}
	}
	q := a16pNew(t, 3, dlq.Config{})
	q.add(t, 1, "5-0", "x", "a")
	for _, s := range append(bad, "1-0@3", "1-0@4", "5-0") {
		if s == "" {
			continue
		}
		if entries, _, err := q.p.List(context.Background(), dlq.Filter{}, 10, s); err == nil {
			t.Errorf("List(after %q) = %d entries, nil; want an error", s, len(entries))
		}
	}
	if _, err := dlq.NewPartitioned(q.rdb, q.queue, 3, dlq.Config{DeadLetterStream: "{x}:dlq"}); err == nil {
		t.Error("NewPartitioned with a DeadLetterStream: nil error; the doc says it must be empty")
	}
	for _, n := range []int{0, -1, stream.MaxPartitions + 1} {
		if _, err := dlq.NewPartitioned(q.rdb, q.queue, n, dlq.Config{}); err == nil {
			t.Errorf("NewPartitioned(n=%d): nil error", n)
		}
	}
	for _, name := range []string{"", "a{b", "a}b"} {
		if _, err := dlq.NewPartitioned(q.rdb, name, 3, dlq.Config{}); err == nil {
			t.Errorf("NewPartitioned(queue %q): nil error", name)
		}
	}
}

// TestAttack16Part_replayLimitQueueOrder: repeated Replays with a Limit move
// exactly min(Limit, left) jobs each, the next ones in the queue's order,
// each into the partition it died in, once; the cursors are kept until the
// end of every partition and deleted then.
func TestAttack16Part_replayLimitQueueOrder(t *testing.T) {
	q := a16pNew(t, 5, dlq.Config{PageSize: 2})
	want := a16fill(t, q, 3, 7)
	ctx := context.Background()
	left := slices.Clone(want)
	for call := 0; len(left) > 0; call++ {
		if call > len(want) {
			t.Fatal("replays do not end")
		}
		const limit = 4
		res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Limit: limit})
		if err != nil {
			t.Fatalf("Replay %d: %v", call, err)
		}
		if exp := min(limit, len(left)); res.Replayed != exp {
			t.Errorf("Replay %d with Limit %d and %d left: Replayed %d, want %d", call, limit, len(left), res.Replayed, exp)
		}
		if call > 0 && !res.Resumed {
			t.Errorf("Replay %d after a Limit: Resumed false", call)
		}
		moved := min(res.Replayed, len(left))
		left = left[moved:]
		// The dead letters left are exactly the tail of the queue's order.
		dead := q.dead(t)
		var gotLeft []string
		for id := range dead {
			gotLeft = append(gotLeft, id)
		}
		var wantLeft []string
		for _, w := range left {
			wantLeft = append(wantLeft, w.job)
		}
		slices.Sort(gotLeft)
		slices.Sort(wantLeft)
		if !slices.Equal(gotLeft, wantLeft) {
			t.Fatalf("after Replay %d (Limit %d): dead %v, want the queue's tail %v", call, limit, gotLeft, wantLeft)
		}
		cursors := 0
		for _, d := range q.parts {
			_, cur := d.Keys()
			cursors += int(q.rdb.Exists(ctx, cur).Val())
		}
		if len(left) > 0 && cursors == 0 {
			t.Errorf("after Replay %d with %d left: no cursor kept", call, len(left))
		}
		if len(left) == 0 && cursors != 0 {
			// A Limit that lands exactly on the end may need one more call.
			res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Limit: limit})
			if err != nil || res.Replayed != 0 {
				t.Errorf("final Replay: %+v, %v", res, err)
			}
			cursors = 0
			for _, d := range q.parts {
				_, cur := d.Keys()
				cursors += int(q.rdb.Exists(ctx, cur).Val())
			}
			if cursors != 0 {
				t.Errorf("replay reached the end of every partition; %d cursors left", cursors)
			}
		}
	}
	src := q.sources(t)
	for _, w := range want {
		if got := src[w.job]; len(got) != 1 || got[0] != w.part {
			t.Errorf("job %s (died in partition %d) is in partitions %v", w.job, w.part, got)
		}
	}
	if len(src) != len(want) {
		t.Errorf("%d jobs in the source streams, want %d", len(src), len(want))
	}
}

// TestAttack16Part_replayFiltersAndNewDeaths: a limited replay of one type,
// new dead letters arriving, then a replay of another filter and unlimited
// ones: in the end every job was replayed exactly once, into its partition.
func TestAttack16Part_replayFiltersAndNewDeaths(t *testing.T) {
	q := a16pNew(t, 4, dlq.Config{PageSize: 3})
	want := a16fill(t, q, 11, 8)
	ctx := context.Background()
	res, err := q.p.Replay(ctx, dlq.Filter{Types: []string{"a"}}, dlq.ReplayOptions{Limit: 3})
	if err != nil || res.Replayed != 3 {
		t.Fatalf("Replay(type a, Limit 3): %+v, %v", res, err)
	}
	for part := range q.parts {
		for i := range 3 {
			job := fmt.Sprintf("new-%d-%d", part, i)
			id := q.add(t, part, "*", job, "a")
			ms, seq := a16parseID(t, id)
			want = append(want, a16pos{ms, seq, part, job})
		}
	}
	res, err = q.p.Replay(ctx, dlq.Filter{Types: []string{"b"}}, dlq.ReplayOptions{Limit: 5})
	if err != nil || res.Replayed != 5 {
		t.Fatalf("Replay(type b, Limit 5): %+v, %v", res, err)
	}
	for i := 0; ; i++ {
		if i > 10 {
			t.Fatalf("replays do not empty the dead letters: %v", q.dead(t))
		}
		if _, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); err != nil {
			t.Fatal(err)
		}
		if len(q.dead(t)) == 0 {
			break
		}
	}
	src := q.sources(t)
	for _, w := range want {
		if got := src[w.job]; len(got) != 1 || got[0] != w.part {
			t.Errorf("job %s (died in partition %d) is in partitions %v", w.job, w.part, got)
		}
	}
	if len(src) != len(want) {
		t.Errorf("%d jobs in the source streams, want %d", len(src), len(want))
	}
}

// TestAttack16Part_lease: a running queue replay refuses another queue
// replay and a replay of any one partition; a partition's replay running
// refuses the queue's replay, which then holds no lease of the others.
func TestAttack16Part_lease(t *testing.T) {
	q := a16pNew(t, 4, dlq.Config{LeaseTTL: 30 * time.Second})
	ctx := context.Background()
	for part := range q.parts {
		for i := range 3 {
			q.add(t, part, "*", fmt.Sprintf("j-%d-%d", part, i), "a")
		}
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	var first dlq.ReplayResult
	go func() {
		var err error
		first, err = q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: func(context.Context, dlq.Entry) error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		}})
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("first Replay returned before its first move: %v", err)
	}
	if _, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Errorf("second queue Replay: %v, want ErrReplayActive", err)
	}
	if _, err := q.p.Replay(ctx, dlq.Filter{Types: []string{"zzz"}}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Errorf("queue Replay with another filter: %v, want ErrReplayActive", err)
	}
	for i, d := range q.parts {
		if _, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
			t.Errorf("partition %d Replay during the queue's: %v, want ErrReplayActive", i, err)
		}
	}
	close(release)
	if err := <-done; err != nil || first.Replayed != 12 {
		t.Fatalf("first Replay: %+v, %v; want 12 replayed", first, err)
	}

	// Now partition 2 replays alone and blocks.
	for part := range q.parts {
		for i := range 2 {
			q.add(t, part, "*", fmt.Sprintf("k-%d-%d", part, i), "a")
		}
	}
	entered = make(chan struct{})
	release = make(chan struct{})
	once = sync.Once{}
	go func() {
		_, err := q.parts[2].Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: func(context.Context, dlq.Entry) error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		}})
		done <- err
	}()
	<-entered
	if _, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); !errors.Is(err, dlq.ErrReplayActive) {
		t.Errorf("queue Replay while partition 2 replays: %v, want ErrReplayActive", err)
	}
	for i, d := range q.parts {
		lease, _ := d.Keys()
		if i != 2 && q.rdb.Exists(ctx, lease).Val() != 0 {
			t.Errorf("the refused queue Replay left partition %d's lease %s", i, lease)
		}
	}
	for _, i := range []int{0, 1, 3} {
		if res, err := q.parts[i].Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{}); err != nil || res.Replayed != 2 {
			t.Errorf("partition %d Replay after the refused queue Replay: %+v, %v", i, res, err)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("partition 2 Replay: %v", err)
	}
	src := q.sources(t)
	if len(src) != 20 {
		t.Errorf("%d jobs in the sources, want 20", len(src))
	}
	for id, parts := range src {
		if len(parts) != 1 {
			t.Errorf("job %s in partitions %v", id, parts)
		}
	}
}

// TestAttack16Part_concurrentReplays: eight goroutines replay the queue at
// once, each retrying on ErrReplayActive, with a small Limit: every job is
// replayed exactly once and no call replays more than the Limit.
func TestAttack16Part_concurrentReplays(t *testing.T) {
	q := a16pNew(t, 6, dlq.Config{PageSize: 4})
	ctx := context.Background()
	total := 0
	for part := range q.parts {
		for i := range 25 {
			q.add(t, part, "*", fmt.Sprintf("j-%d-%d", part, i), "a")
			total++
		}
	}
	var mu sync.Mutex
	replayed := 0
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10000; i++ {
				res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{Limit: 7})
				if errors.Is(err, dlq.ErrReplayActive) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("goroutine %d: %w", g, err)
					return
				}
				if res.Replayed > 7 {
					errs <- fmt.Errorf("goroutine %d: Replayed %d > Limit 7", g, res.Replayed)
				}
				mu.Lock()
				replayed += res.Replayed
				done := replayed >= total
				mu.Unlock()
				if done || res.Replayed == 0 && len(q.dead(t)) == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if replayed != total {
		t.Errorf("calls report %d replayed, want %d", replayed, total)
	}
	src := q.sources(t)
	for part := range q.parts {
		for i := range 25 {
			id := fmt.Sprintf("j-%d-%d", part, i)
			if got := src[id]; len(got) != 1 || got[0] != part {
				t.Errorf("job %s in partitions %v, want [%d]", id, got, part)
			}
		}
	}
	if d := q.dead(t); len(d) != 0 {
		t.Errorf("still dead: %v", d)
	}
}

// TestAttack16Part_leaseTaken: one partition's lease taken by someone else
// while the queue replays: no entry of that partition moves after, the
// replay ends with ErrLeaseLost, and a replay once it is free moves the rest,
// nothing twice.
func TestAttack16Part_leaseTaken(t *testing.T) {
	q := a16pNew(t, 3, dlq.Config{LeaseTTL: 3 * time.Second})
	ctx := context.Background()
	for i := range 10 {
		for part := range q.parts {
			q.add(t, part, fmt.Sprintf("%d-0", 1000+i), fmt.Sprintf("j-%d-%d", part, i), "a")
		}
	}
	lease1, _ := q.parts[1].Keys()
	moves := 0
	stolen := false
	var afterSteal []string
	_, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: func(_ context.Context, e dlq.Entry) error {
		moves++
		if moves == 5 {
			if err := q.rdb.Set(ctx, lease1, "intruder", time.Minute).Err(); err != nil {
				return err
			}
			stolen = true
			return nil
		}
		if stolen {
			afterSteal = append(afterSteal, e.Stream+" "+e.ID)
		}
		return nil
	}})
	if !errors.Is(err, dlq.ErrLeaseLost) {
		t.Errorf("Replay with partition 1's lease taken: %v, want ErrLeaseLost", err)
	}
	dead := q.dead(t)
	src := q.sources(t)
	// Move 5 is partition 1's second entry (1001-0): its BeforeMove took the
	// lease, so neither it nor any later entry of partition 1 may have moved.
	for i := 1; i < 10; i++ {
		id := fmt.Sprintf("j-1-%d", i)
		if len(src[id]) != 0 {
			t.Errorf("job %s of partition 1 moved after its lease was taken (BeforeMove after the steal saw %v)", id, afterSteal)
		}
	}
	if err := q.rdb.Del(ctx, lease1).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatalf("Replay after the lease is free: %v", err)
	}
	src = q.sources(t)
	for part := range q.parts {
		for i := range 10 {
			id := fmt.Sprintf("j-%d-%d", part, i)
			if got := src[id]; len(got) != 1 || got[0] != part {
				t.Errorf("job %s in %v, want [%d]", id, got, part)
			}
		}
	}
	if d := q.dead(t); len(d) != 0 {
		t.Errorf("still dead after the second replay (%+v): %v (dead after the first: %d)", res, d, len(dead))
	}
}

// TestAttack16Part_interrupted: a replay cancelled midway, and one whose
// BeforeMove fails, resume with the same filter: nothing lost, nothing
// twice, and BeforeMove is called again for the entry that failed.
func TestAttack16Part_interrupted(t *testing.T) {
	q := a16pNew(t, 4, dlq.Config{PageSize: 3})
	want := a16fill(t, q, 99, 10)
	ctx := context.Background()
	var failed dlq.Entry // the entry whose BeforeMove failed last round
	for round := 0; ; round++ {
		if round > 3*len(want) {
			t.Fatal("replays do not end")
		}
		cctx, cancel := context.WithCancel(ctx)
		k := 0
		var first, hookFailed dlq.Entry
		res, err := q.p.Replay(cctx, dlq.Filter{}, dlq.ReplayOptions{BeforeMove: func(_ context.Context, e dlq.Entry) error {
			k++
			if k == 1 {
				first = e
			}
			switch {
			case round%2 == 0 && k == 3:
				cancel()
			case round%2 == 1 && k == 4:
				hookFailed = e
				return errors.New("hook says no")
			}
			return nil
		}})
		cancel()
		if failed.ID != "" && k > 0 && (first.ID != failed.ID || first.Stream != failed.Stream) {
			t.Errorf("round %d: the first BeforeMove is for %s in %s, want %s in %s whose hook failed last round",
				round, first.ID, first.Stream, failed.ID, failed.Stream)
		}
		failed = hookFailed
		if err == nil {
			break
		}
		if round == 0 && res.Resumed {
			t.Errorf("first replay reports Resumed")
		}
		if round > 0 && !res.Resumed && res.Examined > 0 {
			t.Errorf("round %d: an interrupted replay's successor does not report Resumed (%+v)", round, res)
		}
	}
	src := q.sources(t)
	for _, w := range want {
		if got := src[w.job]; len(got) != 1 || got[0] != w.part {
			t.Errorf("job %s (died in partition %d) is in partitions %v", w.job, w.part, got)
		}
	}
	if d := q.dead(t); len(d) != 0 {
		t.Errorf("still dead: %v", d)
	}
}

// TestAttack16Part_hostileEntries: one partition's dead letters hold entries
// no consumer writes (no fields of the wire format, a 2 MB field, more than
// stream.MaxFields fields, garbage dead_* values, duplicated fields): List,
// Count, Get and FindJob still answer, and Replay moves the other partitions'
// jobs, once each.
func TestAttack16Part_hostileEntries(t *testing.T) {
	q := a16pNew(t, 3, dlq.Config{PageSize: 2})
	ctx := context.Background()
	for part := range q.parts {
		for i := range 4 {
			q.add(t, part, "*", fmt.Sprintf("good-%d-%d", part, i), "a")
		}
	}
	hs := q.parts[1].Stream()
	huge := strings.Repeat("x", 2<<20)
	many := []any{"type", "a", "payload", "{}", "job_id", "many"}
	for i := range 3 * stream.MaxFields {
		many = append(many, "h"+strconv.Itoa(i), "v")
	}
	hostile := [][]any{
		{"x", "y"},
		{"type", "a", "payload", huge, "job_id", "huge", "dead_reason", "permanent"},
		many,
		{"type", "a", "payload", "{}", "job_id", "garbage", "dead_at", "not-a-time", "dead_attempts", "-x", "attempt", "zz"},
		{"type", "a", "type", "b", "job_id", "dup", "job_id", "dup2", "payload", "{}"},
		{"dead_reason", "permanent"},
		{"type", "", "payload", "", "job_id", ""},
	}
	for _, v := range hostile {
		if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: hs, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for part := range q.parts {
		q.add(t, part, "*", fmt.Sprintf("late-%d", part), "a")
	}
	total := 3*5 + len(hostile)
	if n, err := q.p.Count(ctx, dlq.Filter{}); err != nil || n != total {
		t.Errorf("Count: %d, %v; want %d", n, err, total)
	}
	if n, err := q.p.Count(ctx, dlq.Filter{Types: []string{"a"}, ErrorContains: "boom"}); err != nil || n != 15 {
		t.Errorf("Count(type a, error boom): %d, %v; want 15", n, err)
	}
	got := a16page(t, q, dlq.Filter{}, 3, nil)
	if len(got) != total {
		t.Errorf("List pages: %d entries, want %d", len(got), total)
	}
	for _, id := range []string{"good-0-1", "late-2", "huge", "garbage"} {
		e, err := q.p.FindJob(ctx, id)
		if v, _ := e.Value("job_id"); err != nil || v != id {
			t.Errorf("FindJob(%q): %q, %v", id, v, err)
			continue
		}
		if _, err := q.p.Get(ctx, e.ID); err != nil {
			t.Errorf("Get(%s): %v", e.ID, err)
		}
	}
	if _, err := q.p.FindJob(ctx, "nobody"); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("FindJob(nobody): %v, want ErrNotFound", err)
	}
	if _, err := q.p.Get(ctx, "1-1"); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Get(1-1): %v, want ErrNotFound", err)
	}
	res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatalf("Replay: %+v, %v", res, err)
	}
	src := q.sources(t)
	for part := range q.parts {
		for _, id := range []string{fmt.Sprintf("good-%d-0", part), fmt.Sprintf("good-%d-3", part), fmt.Sprintf("late-%d", part)} {
			if g := src[id]; len(g) != 1 || g[0] != part {
				t.Errorf("job %s in %v, want [%d] (result %+v)", id, g, part, res)
			}
		}
	}
	left, _ := q.p.Count(ctx, dlq.Filter{})
	if res.Replayed+left != total || res.Skipped < 1 {
		t.Errorf("Replay %+v and %d left, from %d (the %d-field entry skipped)", res, left, total, 3*stream.MaxFields+3)
	}
	var inSources int
	for _, parts := range src {
		inSources += len(parts)
	}
	if inSources != res.Replayed {
		t.Errorf("%d entries in the sources, Replay says %d", inSources, res.Replayed)
	}
}

// TestAttack16Part_wrongKeyType: one partition's dead-letter key, or its
// source stream, is not a stream. Whatever the calls return, no job is lost
// or doubled, and once the key is fixed a replay moves every job once.
func TestAttack16Part_wrongKeyType(t *testing.T) {
	for _, which := range []string{"dead", "source"} {
		t.Run(which, func(t *testing.T) {
			q := a16pNew(t, 3, dlq.Config{PageSize: 2})
			ctx := context.Background()
			for part := range q.parts {
				for i := range 3 {
					q.add(t, part, fmt.Sprintf("%d-0", 10+i), fmt.Sprintf("j-%d-%d", part, i), "a")
				}
			}
			bad := q.parts[1].Stream()
			if which == "source" {
				bad = q.parts[1].Source()
			}
			var saved []redis.XMessage
			if which == "dead" {
				saved = q.rdb.XRange(ctx, bad, "-", "+").Val()
				q.rdb.Del(ctx, bad)
				q.rdb.HSet(ctx, bad, "f", "v")
			} else {
				q.rdb.Set(ctx, bad, "not a stream", 0)
			}
			_, _, lerr := q.p.List(ctx, dlq.Filter{}, 100, "")
			_, cerr := q.p.Count(ctx, dlq.Filter{})
			res, rerr := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
			t.Logf("%s key %s wrong type: List %v; Count %v; Replay %+v, %v", which, bad, lerr, cerr, res, rerr)
			if which == "dead" && (lerr == nil || cerr == nil) {
				t.Errorf("a dead-letter key that is a hash: List %v, Count %v; want errors", lerr, cerr)
			}
			if rerr == nil && which == "source" {
				t.Errorf("Replay into a source that is a string: no error (%+v)", res)
			}
			// Fix the key.
			q.rdb.Del(ctx, bad)
			for _, m := range saved {
				q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: bad, ID: m.ID, Values: m.Values})
			}
			poll.Until(t, 30*time.Second, func() (bool, string) {
				_, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
				return err == nil, fmt.Sprint(err)
			})
			src := q.sources(t)
			for part := range q.parts {
				for i := range 3 {
					id := fmt.Sprintf("j-%d-%d", part, i)
					if got := src[id]; len(got) != 1 || got[0] != part {
						t.Errorf("job %s in %v, want [%d]", id, got, part)
					}
				}
			}
			if d := q.dead(t); len(d) != 0 {
				t.Errorf("still dead: %v", d)
			}
		})
	}
}

// TestAttack16Part_overMaxFieldsSkipped: ReplayResult.Skipped "is how many
// matching entries stayed dead because they have more job fields than an
// entry may have (stream.MaxFields)", and MaxFields is the most an entry may
// have "besides the wire format's own". An entry with MaxFields+5 such
// fields (which stream decoding rejects) must stay dead.
func TestAttack16Part_overMaxFieldsSkipped(t *testing.T) {
	q := a16pNew(t, 2, dlq.Config{})
	ctx := context.Background()
	many := []any{"type", "a", "payload", "{}", "job_id", "many", "dead_reason", "permanent"}
	for i := range stream.MaxFields + 5 {
		many = append(many, "h"+strconv.Itoa(i), "v")
	}
	if err := q.rdb.XAdd(ctx, &redis.XAddArgs{Stream: q.parts[1].Stream(), Values: many}).Err(); err != nil {
		t.Fatal(err)
	}
	q.add(t, 0, "*", "ok", "a")
	entries, _, err := q.p.List(ctx, dlq.Filter{}, 10, "")
	if err != nil || len(entries) != 2 {
		t.Fatalf("List: %d, %v", len(entries), err)
	}
	for _, e := range entries {
		if v, _ := e.Value("job_id"); v == "many" {
			t.Logf("List: the entry's DecodeErr: %v", e.DecodeErr)
		}
	}
	res, err := q.p.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 1 || res.Skipped != 1 {
		t.Errorf("Replay: %+v; want Replayed 1 (ok) and Skipped 1 (the entry over MaxFields)", res)
	}
	if src := q.sources(t); len(src["many"]) != 0 {
		t.Errorf("the entry with %d header fields was moved to partition %v", stream.MaxFields+5, src["many"])
	}
}
