package partition

// Outside tests (attack16, dead letters): pelican dlq ls|show|replay|purge
// --partitions N against real processes, SIGKILLed midway, racing, and fed
// hostile entries written with redis-cli; and the pauses in Consumer.Health.
// Written from README.md, docs/scaling.md and the godoc only. Partitions are
// plain streams, so a private single redis-server serves.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// d16Queue returns a fresh queue name and its n partition streams.
func d16Queue(t *testing.T, n int) (string, []string) {
	t.Helper()
	queue := "d16:" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	streams, err := stream.Partitions(queue, n)
	if err != nil {
		t.Fatal(err)
	}
	return queue, streams
}

// d16Dead writes count dead letters per partition (job IDs "j<part>-<i>"),
// with the given entry IDs when ids is set (the same IDs in every partition:
// ties) or automatic ones. Each partition's source stream exists.
func d16Dead(t *testing.T, rdb *redis.Client, streams []string, count int, ids func(i int) string) map[string]int {
	t.Helper()
	ctx := context.Background()
	where := map[string]int{}
	pipe := rdb.Pipeline()
	for part, s := range streams {
		k, _ := stream.KeysFor(s)
		pipe.XGroupCreateMkStream(ctx, s, group, "$")
		for i := range count {
			id := "*"
			if ids != nil {
				id = ids(i)
			}
			job := fmt.Sprintf("j%d-%d", part, i)
			where[job] = part
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: k.Dead, ID: id, Values: []any{
				"type", "t", "payload", `{"n":1}`, "job_id", job, "attempt", "2",
				"dead_reason", "permanent", "dead_error", "boom", "dead_at", strconv.FormatInt(time.Now().UnixMilli(), 10),
				"dead_attempts", "3", "dead_consumer", "c", "dead_stream", s,
			}})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return where
}

// d16Check: every job of where is once in the source stream of its
// partition, no other job is there, and no dead letter is left.
func d16Check(t *testing.T, rdb *redis.Client, streams []string, where map[string]int) {
	t.Helper()
	ctx := context.Background()
	got := map[string][]int{}
	dead := 0
	for part, s := range streams {
		msgs, err := rdb.XRange(ctx, s, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			id, _ := m.Values[stream.FieldJobID].(string)
			got[id] = append(got[id], part)
		}
		k, _ := stream.KeysFor(s)
		dead += int(rdb.XLen(ctx, k.Dead).Val())
	}
	lost, doubled, misplaced := 0, 0, 0
	for job, part := range where {
		switch g := got[job]; {
		case len(g) == 0:
			lost++
		case len(g) > 1:
			doubled++
			t.Errorf("job %s replayed %d times (partitions %v)", job, len(g), g)
		case g[0] != part:
			misplaced++
			t.Errorf("job %s died in partition %d, replayed into %d", job, part, g[0])
		}
	}
	if lost != 0 || len(got) != len(where) || dead != 0 {
		t.Errorf("%d jobs: %d lost, %d doubled, %d misplaced, %d foreign jobs in the sources, %d dead letters left",
			len(where), lost, doubled, misplaced, len(got)-len(where)+lost, dead)
	}
}

func d16SourceLen(rdb *redis.Client, streams []string) int64 {
	var n int64
	for _, s := range streams {
		n += rdb.XLen(context.Background(), s).Val()
	}
	return n
}

// TestAttack16DLQ_killMidReplay: "a crash at any point neither loses nor
// doubles a job"; "running the same command (same filters) again continues
// where it stopped, so each job is replayed once". pelican dlq replay
// --partitions is stopped by SIGTERM (exit 130), then SIGKILLed twice
// midway, then run to the end.
func TestAttack16DLQ_killMidReplay(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	const n = 5
	queue, streams := d16Queue(t, n)
	where := d16Dead(t, rdb, streams, 60, nil) // 300 jobs
	args := []string{"--redis", "redis://" + srv.Addr() + "/0", "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "30"}
	for kill, ev := range []struct {
		at  int64
		sig syscall.Signal
	}{{30, syscall.SIGTERM}, {90, syscall.SIGKILL}, {160, syscall.SIGKILL}} {
		at := ev.at
		// Wait for the lease of the killed run to expire (exit 3 meanwhile).
		var cmd *exec.Cmd
		poll.Until(t, 60*time.Second, func() (bool, string) {
			cmd = exec.Command(a16CLI(t), args...)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Either it moves jobs, or it exits (3: the lease is still held).
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			for {
				select {
				case err := <-exited:
					var ee *exec.ExitError
					if errors.As(err, &ee) && ee.ExitCode() == 3 {
						return false, "exit 3: " + out.String()
					}
					t.Fatalf("run %d exited before the kill: %v: %s", kill, err, out.String())
				default:
				}
				if d16SourceLen(rdb, streams) >= at {
					if err := cmd.Process.Signal(ev.sig); err != nil {
						t.Fatal(err)
					}
					err := <-exited
					var ee *exec.ExitError
					if ev.sig == syscall.SIGTERM && (!errors.As(err, &ee) || ee.ExitCode() != 130) {
						t.Errorf("replay stopped by SIGTERM: %v, want exit 130: %s", err, out.String())
					}
					return true, ""
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		t.Logf("run %d stopped by %v with %d jobs replayed", kill, ev.sig, d16SourceLen(rdb, streams))
	}
	var out string
	var code int
	poll.Until(t, 60*time.Second, func() (bool, string) {
		out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0")
		return code != 3, out
	})
	if code != 0 {
		t.Fatalf("final replay: exit %d: %s", code, out)
	}
	t.Logf("final replay: %s", strings.TrimSpace(out))
	d16Check(t, rdb, streams, where)
	// Nothing more to do, and no cursor or lease left behind.
	out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0")
	if code != 0 {
		t.Errorf("replay of an empty queue: exit %d: %s", code, out)
	}
	for _, s := range streams {
		k, _ := stream.KeysFor(s)
		if keys := rdb.Keys(context.Background(), k.Dead+":replay*").Val(); len(keys) != 0 {
			t.Errorf("left after the replay finished: %v", keys)
		}
	}
	d16Check(t, rdb, streams, where)
}

// TestAttack16DLQ_concurrentCLIReplays: "Only one replay of a dead-letter
// stream runs at a time: another one exits 3", here for the queue, and for
// a replay of one partition alone (without --partitions) during it.
func TestAttack16DLQ_concurrentCLIReplays(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	const n = 4
	queue, streams := d16Queue(t, n)
	where := d16Dead(t, rdb, streams, 20, nil)
	first := exec.Command(a16CLI(t), "--redis", "redis://"+srv.Addr()+"/0", "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "10")
	var fout strings.Builder
	first.Stdout, first.Stderr = &fout, &fout
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, func() (bool, string) {
		return d16SourceLen(rdb, streams) >= 2, "waiting for the first replay to move jobs"
	})
	running := func() bool { return d16SourceLen(rdb, streams) < 80 }
	out, code := a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0")
	if running() && code != 3 {
		t.Errorf("second queue replay during the first: exit %d, want 3: %s", code, out)
	}
	for _, s := range []string{streams[0], streams[3]} {
		out, code = a16Run(t, srv.Addr(), "dlq", "replay", s, "--yes", "--rate", "0")
		if running() && code != 3 {
			t.Errorf("replay of partition %s alone during the queue's: exit %d, want 3: %s", s, code, out)
		}
	}
	out, code = a16Run(t, srv.Addr(), "dlq", "purge", queue, "--partitions", strconv.Itoa(n), "--dry-run")
	if code != 0 {
		t.Errorf("purge --dry-run during a replay: exit %d: %s", code, out)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first replay: %v: %s", err, fout.String())
	}
	d16Check(t, rdb, streams, where)
}

// d16Entry is what dlq ls -o json prints per entry.
type d16Entry struct {
	ID        string `json:"id"`
	Partition int    `json:"partition"`
	Stream    string `json:"dead_letter_stream"`
	JobID     string `json:"job_id"`
}

// TestAttack16DLQ_lsPaging: ls --partitions pages with --limit and --after
// <entry ID>@<partition> (as it prints it) give every entry once in the
// documented order, with equal IDs in every partition and entries added
// between pages.
func TestAttack16DLQ_lsPaging(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	const n = 4
	queue, streams := d16Queue(t, n)
	where := d16Dead(t, rdb, streams, 6, func(i int) string { return fmt.Sprintf("%d-%d", 1000+i/2, i%2) })
	for _, limit := range []int{1, 3, 5} {
		var got []d16Entry
		after := ""
		for page := 0; ; page++ {
			if page > 200 {
				t.Fatalf("limit %d: too many pages", limit)
			}
			args := []string{"dlq", "ls", queue, "--partitions", strconv.Itoa(n), "--limit", strconv.Itoa(limit), "-o", "json"}
			if after != "" {
				args = append(args, "--after", after)
			}
			cmd := exec.Command(a16CLI(t), append([]string{"--redis", "redis://" + srv.Addr() + "/0"}, args...)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("ls %v: %v: %s", args, err, stderr.String())
			}
			var entries []d16Entry
			if err := json.Unmarshal([]byte(stdout.String()), &entries); err != nil {
				t.Fatalf("ls json: %v: %q", err, stdout.String())
			}
			if len(entries) > limit {
				t.Fatalf("ls --limit %d printed %d entries", limit, len(entries))
			}
			got = append(got, entries...)
			// The hint on stderr names the next position; it must be the last
			// entry's position when there is one.
			_, hint, more := strings.Cut(stderr.String(), "--after ")
			hint = strings.TrimSpace(hint)
			if !more {
				break
			}
			if len(entries) == 0 {
				t.Fatalf("ls: empty page with a hint %q", hint)
			}
			last := entries[len(entries)-1]
			if want := last.ID + "@" + strconv.Itoa(last.Partition); hint != want {
				t.Errorf("ls hint --after %q, want the last entry's position %q", hint, want)
			}
			if page == 1 && limit == 3 {
				// A new dead letter in every partition, and the current
				// position's ID in the partitions after it.
				d16Extra(t, rdb, streams, where, last)
			}
			after = hint
		}
		var jobs []string
		for i, e := range got {
			jobs = append(jobs, e.JobID)
			if e.Stream != deadOf(streams[e.Partition]) {
				t.Errorf("entry %s: partition %d, dead_letter_stream %q", e.ID, e.Partition, e.Stream)
			}
			if i > 0 && !d16Before(t, got[i-1], e) {
				t.Errorf("limit %d: entry %s@%d after %s@%d: not the queue's order", limit, e.ID, e.Partition, got[i-1].ID, got[i-1].Partition)
			}
		}
		var want []string
		for j := range where {
			want = append(want, j)
		}
		s := slices.Clone(jobs)
		slices.Sort(s)
		slices.Sort(want)
		if !slices.Equal(s, want) {
			t.Errorf("limit %d: pages list %d entries %v, want each of %d once: %v", limit, len(jobs), jobs, len(want), want)
		}
	}
}

func deadOf(s string) string { k, _ := stream.KeysFor(s); return k.Dead }

func d16Extra(t *testing.T, rdb *redis.Client, streams []string, where map[string]int, last d16Entry) {
	t.Helper()
	ctx := context.Background()
	for part, s := range streams {
		job := fmt.Sprintf("extra-%d", part)
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: deadOf(s), Values: []any{"type", "t", "payload", "{}", "job_id", job, "dead_reason", "permanent"}}).Err(); err != nil {
			t.Fatal(err)
		}
		where[job] = part
		if part > last.Partition {
			job := fmt.Sprintf("tie-%d", part)
			// Free only if that partition has no entry with this ID yet.
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: deadOf(s), ID: last.ID, Values: []any{"type", "t", "payload", "{}", "job_id", job, "dead_reason", "permanent"}}).Err(); err == nil {
				where[job] = part
			}
		}
	}
}

func d16Before(t *testing.T, a, b d16Entry) bool {
	t.Helper()
	pa := strings.SplitN(a.ID, "-", 2)
	pb := strings.SplitN(b.ID, "-", 2)
	am, _ := strconv.ParseUint(pa[0], 10, 64)
	as, _ := strconv.ParseUint(pa[1], 10, 64)
	bm, _ := strconv.ParseUint(pb[0], 10, 64)
	bs, _ := strconv.ParseUint(pb[1], 10, 64)
	if am != bm {
		return am < bm
	}
	if as != bs {
		return as < bs
	}
	return a.Partition < b.Partition
}

// TestAttack16DLQ_badValues: bad --partitions and --after values are usage
// errors (exit 2) naming what is wrong, and change nothing.
func TestAttack16DLQ_badValues(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	const n = 3
	queue, streams := d16Queue(t, n)
	where := d16Dead(t, rdb, streams, 2, nil)
	for _, a := range []string{"garbage", "1-0", "1-0@3", "1-0@-1", "@1", "1-0@", "1-0@1@2", "x-0@1", "1-0@ 1", "1-0@1024", "18446744073709551616-0@0"} {
		out, code := a16Run(t, srv.Addr(), "dlq", "ls", queue, "--partitions", strconv.Itoa(n), "--after", a)
		if code != 2 || !strings.Contains(out, "--after") {
			t.Errorf("ls --after %q: exit %d, want 2 naming --after: %s", a, code, out)
		}
	}
	for _, args := range [][]string{
		{"dlq", "ls", queue, "--partitions", "abc"},
		{"dlq", "ls", queue, "--partitions", "-2"},
		{"dlq", "show", queue, "0-1", "--partitions", "1025"},
		{"dlq", "show", queue, "0-1", "--partitions", "x"},
		{"dlq", "replay", queue, "--partitions", "-1", "--yes"},
		{"dlq", "replay", queue, "--partitions", "2000", "--yes"},
		{"dlq", "purge", queue, "--partitions", "1.5", "--yes"},
		{"dlq", "purge", queue, "--partitions", "99999999999999999999", "--yes"},
	} {
		out, code := a16Run(t, srv.Addr(), args...)
		if code != 2 || !strings.Contains(out, "partitions") {
			t.Errorf("pelican %v: exit %d, want 2 naming --partitions: %s", args, code, out)
		}
	}
	// A queue of another partition count has other stream names: not found.
	for _, args := range [][]string{
		{"dlq", "ls", queue, "--partitions", "4"},
		{"dlq", "replay", queue, "--partitions", "2", "--yes"},
		{"dlq", "purge", queue, "--partitions", "5", "--yes"},
	} {
		out, code := a16Run(t, srv.Addr(), args...)
		if code != 4 {
			t.Errorf("pelican %v: exit %d, want 4 (unknown queue): %s", args, code, out)
		}
	}
	// show: an entry ID or a job ID; unknown ones exit 4.
	out, code := a16Run(t, srv.Addr(), "dlq", "show", queue, "j2-1", "--partitions", strconv.Itoa(n), "-o", "json")
	if code != 0 || !strings.Contains(out, `"partition": 2`) {
		t.Errorf("show by job ID j2-1: exit %d: %s", code, out)
	}
	for _, arg := range []string{"nobody", "1-1"} {
		out, code = a16Run(t, srv.Addr(), "dlq", "show", queue, arg, "--partitions", strconv.Itoa(n))
		if code != 4 {
			t.Errorf("show %q: exit %d, want 4: %s", arg, code, out)
		}
	}
	// Nothing changed.
	for part, s := range streams {
		if l := rdb.XLen(context.Background(), deadOf(s)).Val(); l != 2 {
			t.Errorf("partition %d: %d dead letters, want 2", part, l)
		}
	}
	_ = where
}

// TestAttack16DLQ_hostileEntries: entries written with redis-cli into one
// partition's dead letters (no wire-format fields, a 1 MB field, garbage
// dead_* values, duplicated fields, an empty type) do not stop ls, show or
// replay of the others.
func TestAttack16DLQ_hostileEntries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	const n = 3
	queue, streams := d16Queue(t, n)
	where := d16Dead(t, rdb, streams, 5, nil)
	bad := deadOf(streams[1])
	port := strconv.Itoa(srv.Port())
	cli := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command("redis-cli", append([]string{"-p", port}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Contains(string(out), "ERR") {
			t.Fatalf("redis-cli %v: %v: %s", args, err, out)
		}
	}
	cli("", "XADD", bad, "*", "x", "y")
	cli("", "XADD", bad, "*", "dead_reason", "permanent", "dead_at", "yesterday", "dead_attempts", "many")
	cli(strings.Repeat("z", 1<<20), "-x", "XADD", bad, "*", "type", "t", "job_id", "huge", "dead_reason", "permanent", "payload")
	cli("", "XADD", bad, "*", "type", "t", "type", "u", "job_id", "dup", "payload", "{}", "attempt", "-7", "dead_reason", "nonsense")
	cli("", "XADD", bad, "*", "type", "", "job_id", "", "payload", "\xff\xfe")
	hostile := 5
	out, code := a16Run(t, srv.Addr(), "dlq", "ls", queue, "--partitions", strconv.Itoa(n), "--limit", "1000", "-o", "json")
	if code != 0 {
		t.Fatalf("ls: exit %d: %.2000s", code, out)
	}
	var entries []d16Entry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("ls json: %v: %.2000s", err, out)
	}
	if len(entries) != 15+hostile {
		t.Errorf("ls lists %d entries, want %d", len(entries), 15+hostile)
	}
	out, code = a16Run(t, srv.Addr(), "dlq", "ls", queue, "--partitions", strconv.Itoa(n), "--limit", "1000")
	if code != 0 {
		t.Errorf("ls (table): exit %d: %.2000s", code, out)
	}
	for _, arg := range []string{"huge", "dup", "j0-3"} {
		out, code = a16Run(t, srv.Addr(), "dlq", "show", queue, arg, "--partitions", strconv.Itoa(n))
		if code != 0 {
			t.Errorf("show %s: exit %d: %.500s", arg, code, out)
		}
	}
	out, code = a16Run(t, srv.Addr(), "dlq", "replay", queue, "--partitions", strconv.Itoa(n), "--yes", "--rate", "0", "--type", "t")
	if code != 0 {
		t.Fatalf("replay --type t: exit %d: %s", code, out)
	}
	t.Logf("replay: %s", strings.TrimSpace(out))
	ctx := context.Background()
	got := map[string][]int{}
	for part, s := range streams {
		for _, m := range rdb.XRange(ctx, s, "-", "+").Val() {
			id, _ := m.Values[stream.FieldJobID].(string)
			got[id] = append(got[id], part)
		}
	}
	for job, part := range where {
		if g := got[job]; len(g) != 1 || g[0] != part {
			t.Errorf("job %s: in partitions %v, want [%d]", job, g, part)
		}
	}
	// What matched type t and moved is gone from the dead letters; the rest
	// stays, nothing twice.
	left := 0
	for _, s := range streams {
		left += int(rdb.XLen(ctx, deadOf(s)).Val())
	}
	moved := 0
	for _, g := range got {
		moved += len(g)
	}
	if moved+left != 15+hostile {
		t.Errorf("%d moved + %d left != %d", moved, left, 15+hostile)
	}
}

// TestAttack16_pauseHealth: Health.Paused and PausedTypes show the pauses
// the consumer follows; Held (= Stats.Held) counts the jobs read but not
// started because of them, drops to 0 on resume, and they all run once.
func TestAttack16_pauseHealth(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	s := "d16pause"
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{Type: "slow"}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 100)
	c := consumer.New(rdb, consumer.Config{Stream: s, Group: group, Consumer: "c1", Concurrency: 2, Block: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error { ran <- j.Type + " " + j.ID; return nil }))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	poll.Until(t, 30*time.Second, func() (bool, string) {
		h := c.Health()
		return h.Ready && slices.Equal(h.PausedTypes, []string{"slow"}) && !h.Paused, fmt.Sprintf("%+v", h)
	})
	p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: s})
	for i := range 3 {
		if _, err := p.Enqueue(ctx, &stream.Job{ID: "slow-" + strconv.Itoa(i), Type: "slow", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Enqueue(ctx, &stream.Job{ID: "fast-" + strconv.Itoa(i), Type: "fast", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		for {
			select {
			case r := <-ran:
				seen[r]++
				continue
			default:
			}
			break
		}
		h := c.Health()
		st := c.Stats()
		fast := seen["fast fast-0"] + seen["fast fast-1"] + seen["fast fast-2"]
		return fast == 3 && h.Held == 3 && st.Held == 3, fmt.Sprintf("fast ran %d, Health.Held %d, Stats.Held %d, seen %v", fast, h.Held, st.Held, seen)
	})
	for j := range seen {
		if strings.HasPrefix(j, "slow") {
			t.Errorf("paused job ran: %s", j)
		}
	}
	// The whole queue paused too: Paused, still Ready.
	if err := control.Pause(ctx, rdb, s, control.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		h := c.Health()
		return h.Paused && h.Ready && h.Held == 3, fmt.Sprintf("%+v", h)
	})
	if err := control.Resume(ctx, rdb, s, control.ResumeOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, func() (bool, string) {
		for {
			select {
			case r := <-ran:
				seen[r]++
				continue
			default:
			}
			break
		}
		h := c.Health()
		slow := seen["slow slow-0"] + seen["slow slow-1"] + seen["slow slow-2"]
		return slow == 3 && h.Held == 0 && c.Stats().Held == 0 && !h.Paused && len(h.PausedTypes) == 0, fmt.Sprintf("slow ran %d, %+v", slow, h)
	})
	for j, k := range seen {
		if k != 1 {
			t.Errorf("job %s ran %d times", j, k)
		}
	}
}
