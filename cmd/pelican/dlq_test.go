package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// dlqFixture is a source stream on the shared test Redis, its dead-letter
// stream and the replay keys, all deleted when the test ends.
type dlqFixture struct {
	rdb            *redis.Client
	source, dead   string
	lease, cursor  string
	ctx            context.Context
	nextEntryIDSeq int
}

func setupDLQ(t *testing.T) *dlqFixture {
	t.Helper()
	rdb := redistest.Shared(t)
	source := redistest.Name(t)
	d, err := dlq.New(rdb, source, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lease, cursor := d.Keys()
	fx := &dlqFixture{rdb: rdb, source: source, dead: d.Stream(), lease: lease, cursor: cursor, ctx: context.Background()}
	t.Cleanup(func() { rdb.Del(context.Background(), fx.source, fx.dead, fx.lease, fx.cursor) })
	return fx
}

// deadJob describes one dead-letter entry to write.
type deadJob struct {
	typ, reason, errText string
	payload              string
	deadAt               time.Time
}

// add XADDs dead-letter entries as consumer/dead.lua writes them: the
// job's fields, then the dead_* fields. It returns the entry IDs and the
// job IDs.
func (fx *dlqFixture) add(t *testing.T, jobs ...deadJob) (ids, jobIDs []string) {
	t.Helper()
	pipe := fx.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(jobs))
	for i, j := range jobs {
		fx.nextEntryIDSeq++
		jobID := fmt.Sprintf("job-%s-%d", fx.source, fx.nextEntryIDSeq)
		if j.payload == "" {
			j.payload = `{"n":` + strconv.Itoa(fx.nextEntryIDSeq) + `}`
		}
		if j.deadAt.IsZero() {
			j.deadAt = time.Now()
		}
		if j.reason == "" {
			j.reason = "exhausted"
		}
		if j.typ == "" {
			j.typ = "email.send"
		}
		jobIDs = append(jobIDs, jobID)
		cmds[i] = pipe.XAdd(fx.ctx, &redis.XAddArgs{Stream: fx.dead, Values: []any{
			"v", "1", "type", j.typ, "payload", j.payload, "job_id", jobID, "attempt", "4",
			"dead_reason", j.reason,
			"dead_error", j.errText,
			"dead_at", strconv.FormatInt(j.deadAt.UnixMilli(), 10),
			"dead_attempts", "5",
			"dead_consumer", "worker-1",
			"dead_entry_id", fmt.Sprintf("%d-%d", j.deadAt.UnixMilli()-1000, fx.nextEntryIDSeq),
			"dead_stream", fx.source,
		}})
	}
	if _, err := pipe.Exec(fx.ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		ids = append(ids, c.Val())
	}
	return ids, jobIDs
}

// addMany adds n plain dead jobs.
func (fx *dlqFixture) addMany(t *testing.T, n int) (jobIDs []string) {
	t.Helper()
	for n > 0 {
		batch := make([]deadJob, min(n, 500))
		_, js := fx.add(t, batch...)
		jobIDs = append(jobIDs, js...)
		n -= len(batch)
	}
	return jobIDs
}

// sourceJobIDs counts the job_id of every entry in the source stream.
func (fx *dlqFixture) sourceJobIDs(t *testing.T) map[string]int {
	t.Helper()
	msgs, err := fx.rdb.XRange(fx.ctx, fx.source, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, len(msgs))
	for _, m := range msgs {
		id, _ := m.Values["job_id"].(string)
		seen[id]++
	}
	return seen
}

// checkReplayedOnce fails unless every job in want is in the source stream
// exactly once, nothing else is, and the dead-letter stream is empty.
func (fx *dlqFixture) checkReplayedOnce(t *testing.T, want []string) {
	t.Helper()
	seen := fx.sourceJobIDs(t)
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("job %s is %d times in the source stream, want once", id, seen[id])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("source stream has %d distinct jobs, want %d", len(seen), len(want))
	}
	if n := fx.rdb.XLen(fx.ctx, fx.dead).Val(); n != 0 {
		t.Errorf("dead-letter stream still has %d entries, want 0", n)
	}
	if n := fx.rdb.Exists(fx.ctx, fx.cursor, fx.lease).Val(); n != 0 {
		t.Errorf("replay cursor or lease left behind (%d keys)", n)
	}
}

func mustCode(t *testing.T, want int, stdout, stderr string, code int) {
	t.Helper()
	if code != want {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, want, stdout, stderr)
	}
}

func TestDLQ_LsShow(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	now := time.Now()
	ids, jobIDs := fx.add(t,
		deadJob{typ: "email.send", reason: "exhausted", errText: "smtp: timeout after 30s", deadAt: now.Add(-3 * time.Hour)},
		deadJob{typ: "sms.send", reason: "panic", errText: "runtime error: nil pointer dereference", deadAt: now.Add(-time.Hour)},
		deadJob{typ: "email.send", reason: "permanent", errText: "bad address", payload: "\x00\x01\xffbinary", deadAt: now},
	)
	lsIDs := func(t *testing.T, args ...string) []string {
		t.Helper()
		out, errOut, code := runCLI(t, nil, "", append([]string{"dlq", "ls", fx.source, "-o", "json"}, args...)...)
		mustCode(t, 0, out, errOut, code)
		var es []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Reason   string `json:"reason"`
			Attempts int    `json:"attempts"`
			JobID    string `json:"job_id"`
		}
		if err := json.Unmarshal([]byte(out), &es); err != nil {
			t.Fatalf("ls json: %v\n%s", err, out)
		}
		got := []string{}
		for _, e := range es {
			got = append(got, e.ID)
			if e.Attempts != 5 || e.Type == "" || e.Reason == "" || e.JobID == "" {
				t.Errorf("ls json entry %+v: missing fields", e)
			}
		}
		return got
	}

	t.Run("table", func(t *testing.T) {
		out, errOut, code := runCLI(t, nil, "", "dlq", "ls", fx.source)
		mustCode(t, 0, out, errOut, code)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 {
			t.Fatalf("ls table: %d lines, want header + 3:\n%s", len(lines), out)
		}
		for _, h := range []string{"ID", "DEAD AT", "REASON", "TYPE", "ATTEMPTS", "ERROR"} {
			if !strings.Contains(lines[0], h) {
				t.Errorf("ls header %q lacks %q", lines[0], h)
			}
		}
		for i, want := range []string{"exhausted", "panic", "permanent"} {
			if !strings.HasPrefix(lines[i+1], ids[i]) || !strings.Contains(lines[i+1], want) {
				t.Errorf("ls line %d = %q, want ID %s and reason %s", i+1, lines[i+1], ids[i], want)
			}
		}
		if !strings.Contains(lines[1], "smtp: timeout") {
			t.Errorf("ls line lacks the error: %q", lines[1])
		}
	})

	t.Run("filters", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{nil, ids},
			{[]string{"--type", "email.send"}, []string{ids[0], ids[2]}},
			{[]string{"--type", "sms.send", "--type", "email.send"}, ids},
			{[]string{"--reason", "panic"}, ids[1:2]},
			{[]string{"--since", "2h"}, ids[1:]},
			{[]string{"--until", "2h"}, ids[:1]},
			{[]string{"--since", now.Add(-90 * time.Minute).UTC().Format(time.RFC3339), "--until", "30m"}, ids[1:2]},
			{[]string{"--error", "timeout"}, ids[:1]},
			{[]string{"--limit", "2"}, ids[:2]},
			{[]string{"--after", ids[0], "--limit", "1"}, ids[1:2]},
			{[]string{"--type", "nope"}, []string{}},
		} {
			if got := lsIDs(t, tc.args...); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("ls %v = %v, want %v", tc.args, got, tc.want)
			}
		}
		_, errOut, _ := runCLI(t, nil, "", "dlq", "ls", fx.source, "--limit", "1")
		if !strings.Contains(errOut, "--after "+ids[0]) {
			t.Errorf("ls --limit 1: stderr %q does not say how to get the next page", errOut)
		}
	})

	t.Run("bad filter syntax", func(t *testing.T) {
		for _, args := range [][]string{
			{"dlq", "ls", fx.source, "--since", "yesterday"},
			{"dlq", "ls", fx.source, "--until", "-5m"},
			{"dlq", "ls", fx.source, "--since", "1h", "--until", "2h"},
			{"dlq", "replay", fx.source, "--since", "2026-13-01", "--yes"},
			{"dlq", "purge", fx.source, "--until", "soon", "--yes"},
			{"dlq", "ls", fx.source, "--limit", "x"},
		} {
			out, errOut, code := runCLI(t, nil, "", args...)
			mustCode(t, exitUsage, out, errOut, code)
			flag := args[3]
			if !strings.Contains(errOut, flag) {
				t.Errorf("%v: stderr %q does not name %s", args, errOut, flag)
			}
		}
		if n := fx.rdb.XLen(fx.ctx, fx.dead).Val(); n != 3 {
			t.Errorf("a failed command changed the DLQ: %d entries, want 3", n)
		}
	})

	t.Run("show", func(t *testing.T) {
		out, errOut, code := runCLI(t, nil, "", "dlq", "show", fx.source, ids[2])
		mustCode(t, 0, out, errOut, code)
		order := []string{"v", "type", "payload", "job_id", "attempt", "dead_reason", "dead_error", "dead_at",
			"dead_attempts", "dead_consumer", "dead_entry_id", "dead_stream"}
		last := -1
		for _, f := range order {
			i := strings.Index(out, "  "+f+" ")
			if i <= last {
				t.Errorf("show: field %s missing or out of order:\n%s", f, out)
			}
			last = i
		}
		for _, want := range []string{"hex:0001ff62696e617279", jobIDs[2], "email.send", "bad address", "permanent"} {
			if !strings.Contains(out, want) {
				t.Errorf("show lacks %q:\n%s", want, out)
			}
		}
		out, errOut, code = runCLI(t, nil, "", "dlq", "show", fx.source, ids[0], "-o", "json")
		mustCode(t, 0, out, errOut, code)
		var e struct {
			ID     string
			Fields []struct{ Name, Value, Encoding string }
			Job    *struct {
				ID, Type string
			}
		}
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatalf("show json: %v\n%s", err, out)
		}
		if e.ID != ids[0] || len(e.Fields) != len(order) || e.Job == nil || e.Job.ID != jobIDs[0] || e.Job.Type != "email.send" {
			t.Errorf("show json = %+v", e)
		}
		for i, f := range e.Fields {
			if f.Name != order[i] || f.Encoding != "text" {
				t.Errorf("show json field %d = %+v, want %s as text", i, f, order[i])
			}
		}
	})

	t.Run("show unknown", func(t *testing.T) {
		out, errOut, code := runCLI(t, nil, "", "dlq", "show", fx.source, "1-1")
		mustCode(t, exitNotFound, out, errOut, code)
		out, errOut, code = runCLI(t, nil, "", "dlq", "show", fx.source, "not-an-id")
		mustCode(t, exitUsage, out, errOut, code)
	})
}

// A replay at 100/s: 300 moves, the last 2.99 s after the first, measured
// by the replayed entries' IDs (Redis times), not by the process's run,
// which includes its start. Never faster than the rate (plus the pacer's
// 100 ms catch-up burst after a stall); not slower than it by more than
// 10% and twice the stalls this process measured meanwhile (a busy machine
// stalls the CLI too; at 100/s its moves take a small part of each 10 ms).
// The rate the CLI reports agrees with the Redis times.
func TestDLQ_ReplayRate(t *testing.T) {
	t.Parallel()
	const (
		rate       = 100.0
		pacerBurst = 100 * time.Millisecond
	)
	fx := setupDLQ(t)
	want := fx.addMany(t, 300)
	stalls := redistest.WatchStalls(fx.rdb, 2*redistest.StallInterval)
	defer stalls.Stop()
	start := time.Now()
	out, errOut, code := runCLI(t, nil, "", "dlq", "replay", fx.source, "--rate", "100", "--yes", "-o", "json")
	stalled := stalls.Within(start, time.Now())
	mustCode(t, 0, out, errOut, code)
	var res replayJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay json: %v\n%s", err, out)
	}
	if res.Replayed != 300 {
		t.Errorf("replayed %d, want 300", res.Replayed)
	}
	msgs, err := fx.rdb.XRange(fx.ctx, fx.source, "-", "+").Result()
	if err != nil || len(msgs) == 0 {
		t.Fatalf("XRANGE source: %d entries, %v", len(msgs), err)
	}
	first, _ := stream.EntryTime(msgs[0].ID)
	last, _ := stream.EntryTime(msgs[len(msgs)-1].ID)
	span := last.Sub(first)
	schedule := time.Duration(float64(len(msgs)-1) / rate * float64(time.Second))
	t.Logf("replayed %d jobs; the last %v after the first (Redis clock; %v on schedule); the CLI reports %.1f jobs/s over %.3fs; %v stalled meanwhile",
		res.Replayed, span, schedule, res.Rate, res.Seconds, stalled)
	if span < schedule-pacerBurst {
		t.Errorf("the last of %d moves came %v after the first, want at least %v at %.0f/s (less a %v burst)",
			len(msgs), span, schedule, rate, pacerBurst)
	}
	if most := schedule*11/10 + 2*stalled; span > most {
		t.Errorf("the last of %d moves came %v after the first, want at most %v: %v + 10%% + twice the %v stalled",
			len(msgs), span, most, schedule, stalled)
	}
	if redisRate := float64(len(msgs)-1) / span.Seconds(); math.Abs(res.Rate-redisRate) > 0.1*redisRate {
		t.Errorf("the CLI reports %.1f jobs/s, the Redis times show %.1f", res.Rate, redisRate)
	}
	fx.checkReplayedOnce(t, want)
}

func TestDLQ_ReplayInterrupted(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	want := fx.addMany(t, 2000)
	args := []string{"dlq", "replay", fx.source, "--rate", "500", "--yes"}

	cmd := exec.Command(cliPath, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "REDIS_URL=" + testRedisURL()}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	// Interrupt after about 1 s of replay: when ~500 jobs have moved.
	deadline := time.Now().Add(20 * time.Second)
	for fx.rdb.XLen(fx.ctx, fx.source).Val() < 500 {
		if time.Now().After(deadline) {
			t.Fatalf("replay did not move 500 jobs within 20s\nstderr:\n%s", errOut.String())
		}
		time.Sleep(10 * time.Millisecond) // polling Redis, not waiting blindly
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Fatalf("interrupted replay: %v, want exit %d\nstdout:\n%s\nstderr:\n%s", err, exitInterrupted, out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "run the same command again") {
		t.Errorf("interrupted replay does not say how to resume:\n%s", errOut.String())
	}
	moved := fx.rdb.XLen(fx.ctx, fx.source).Val()
	t.Logf("interrupted after %d of 2000 jobs", moved)
	if moved <= 0 || moved >= 2000 {
		t.Fatalf("%d jobs moved before the interrupt, want some but not all", moved)
	}
	if fx.rdb.Exists(fx.ctx, fx.lease).Val() != 0 {
		t.Errorf("interrupted replay left its lease behind")
	}
	// The rerun continues from the cursor.
	o, e, code := runCLI(t, nil, "", append(args, "--rate", "0")...)
	mustCode(t, 0, o, e, code)
	if !strings.Contains(o, "continuing an interrupted replay") {
		t.Errorf("rerun did not resume:\n%s", o)
	}
	fx.checkReplayedOnce(t, want)
}

func TestDLQ_ReplayRefused(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	fx.addMany(t, 5)

	t.Run("declined", func(t *testing.T) {
		for _, stdin := range []string{"n\n", "", "maybe\n"} {
			out, errOut, code := runCLI(t, nil, stdin, "dlq", "replay", fx.source, "--rate", "0")
			mustCode(t, exitRefused, out, errOut, code)
			want := fmt.Sprintf("Replay 5 jobs from %s to %s at no rate limit? [y/N]", fx.dead, fx.source)
			if !strings.Contains(errOut, want) {
				t.Errorf("prompt: stderr %q lacks %q", errOut, want)
			}
		}
		if n := fx.rdb.XLen(fx.ctx, fx.source).Val(); n != 0 {
			t.Errorf("declined replay moved %d jobs", n)
		}
	})

	t.Run("dry run", func(t *testing.T) {
		out, errOut, code := runCLI(t, nil, "", "dlq", "replay", fx.source, "--dry-run")
		mustCode(t, 0, out, errOut, code)
		if !strings.Contains(out, "would replay 5 jobs") {
			t.Errorf("dry run: %q", out)
		}
		if n := fx.rdb.XLen(fx.ctx, fx.source).Val(); n != 0 {
			t.Errorf("dry run moved %d jobs", n)
		}
	})

	t.Run("active", func(t *testing.T) {
		fx.rdb.Set(fx.ctx, fx.lease, "someone-else", time.Minute)
		defer fx.rdb.Del(fx.ctx, fx.lease)
		out, errOut, code := runCLI(t, nil, "", "dlq", "replay", fx.source, "--yes")
		mustCode(t, exitRefused, out, errOut, code)
		if !strings.Contains(errOut, "another replay") {
			t.Errorf("stderr %q does not say another replay is running", errOut)
		}
		if n := fx.rdb.XLen(fx.ctx, fx.source).Val(); n != 0 {
			t.Errorf("refused replay moved %d jobs", n)
		}
	})

	t.Run("answered yes", func(t *testing.T) {
		out, errOut, code := runCLI(t, nil, "yes\n", "dlq", "replay", fx.source, "--rate", "0", "--type", "email.send")
		mustCode(t, 0, out, errOut, code)
		if n := fx.rdb.XLen(fx.ctx, fx.source).Val(); n != 5 {
			t.Errorf("confirmed replay moved %d jobs, want 5", n)
		}
	})
}

func TestDLQ_Purge(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	a := make([]deadJob, 4)
	for i := range a {
		a[i] = deadJob{typ: "a", reason: "panic"}
	}
	b := make([]deadJob, 6)
	for i := range b {
		b[i] = deadJob{typ: "b", reason: "exhausted"}
	}
	fx.add(t, a...)
	keep, _ := fx.add(t, b...)

	out, errOut, code := runCLI(t, nil, "n\n", "dlq", "purge", fx.source, "--type", "a")
	mustCode(t, exitRefused, out, errOut, code)
	if want := fmt.Sprintf("Delete 4 matching entries from %s? [y/N]", fx.dead); !strings.Contains(errOut, want) {
		t.Errorf("prompt: stderr %q lacks %q", errOut, want)
	}
	out, errOut, code = runCLI(t, nil, "", "dlq", "purge", fx.source)
	mustCode(t, exitRefused, out, errOut, code)
	if n := fx.rdb.XLen(fx.ctx, fx.dead).Val(); n != 10 {
		t.Fatalf("declined purge left %d entries, want 10", n)
	}

	out, errOut, code = runCLI(t, nil, "", "dlq", "purge", fx.source, "--reason", "panic", "--dry-run", "-o", "json")
	mustCode(t, 0, out, errOut, code)
	var dry purgeJSON
	if err := json.Unmarshal([]byte(out), &dry); err != nil || !dry.DryRun || dry.Deleted != 4 {
		t.Errorf("dry run json %q (%v), want 4 would be deleted", out, err)
	}

	out, errOut, code = runCLI(t, nil, "", "dlq", "purge", fx.source, "--type", "a", "--yes")
	mustCode(t, 0, out, errOut, code)
	if !strings.Contains(out, "deleted 4 entries") {
		t.Errorf("purge output %q", out)
	}
	msgs := fx.rdb.XRange(fx.ctx, fx.dead, "-", "+").Val()
	got := []string{}
	for _, m := range msgs {
		got = append(got, m.ID)
	}
	if strings.Join(got, ",") != strings.Join(keep, ",") {
		t.Errorf("after purge --type a: %v, want the type b entries %v", got, keep)
	}
	if !strings.Contains(errOut, "purge: 4/4") {
		t.Errorf("purge printed no progress on a non-terminal stderr: %q", errOut)
	}
}

// TestDLQ_unknownStream: a stream that exists neither as itself nor as its
// dead-letter stream exits 4 for every dlq command, as stats, pending and
// trim do, and a key of another type exits 1. A dead-letter stream whose
// source is gone is still operated (the other tests have no source stream).
func TestDLQ_unknownStream(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	missing := fx.source + ":missing"
	for _, args := range [][]string{
		{"dlq", "ls", missing},
		{"dlq", "ls", missing, "-o", "json"},
		{"dlq", "show", missing, "1-1"},
		{"dlq", "replay", missing, "--yes"},
		{"dlq", "replay", missing, "--dry-run"},
		{"dlq", "purge", missing, "--yes"},
		{"dlq", "purge", missing, "--dry-run"},
	} {
		out, errOut, code := runCLI(t, nil, "", args...)
		mustCode(t, exitNotFound, out, errOut, code)
		if !strings.Contains(errOut, `unknown stream "`+missing+`"`) {
			t.Errorf("%v: stderr %q does not name the unknown stream", args, errOut)
		}
	}
	if err := fx.rdb.Set(fx.ctx, fx.source, "not a stream", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dlq", "ls", fx.source}, {"dlq", "purge", fx.source, "--yes"}} {
		out, errOut, code := runCLI(t, nil, "", args...)
		mustCode(t, exitError, out, errOut, code)
		if !strings.Contains(errOut, "wrong key type") {
			t.Errorf("%v: stderr %q, want wrong key type", args, errOut)
		}
	}
}

// TestDLQ_ReplayIdempotency: replay says what it does with idempotency
// records; by default it leaves them, and with --forget-failed-idempotency
// it deletes, before each move, the job's record if and only if it is failed,
// keyed by idempotency_key or else job_id, in the stream's namespace (the
// middleware's default) or under --idempotency-prefix.
func TestDLQ_ReplayIdempotency(t *testing.T) {
	t.Parallel()
	fx := setupDLQ(t)
	keys, _ := stream.KeysFor(fx.source)
	prefix := keys.Idem
	t.Cleanup(func() { redistest.DeleteKeys(fx.rdb, prefix+"*") })
	store := idem.NewRedisStore(fx.rdb, idem.RedisConfig{})
	record := func(key string, st idem.Status) {
		t.Helper()
		key = prefix + key
		if _, err := store.Begin(fx.ctx, key, "w1", time.Minute); err != nil {
			t.Fatal(err)
		}
		switch st {
		case idem.StatusFailed:
			must(t, store.Fail(fx.ctx, key, "w1", "no such account"))
		case idem.StatusCompleted:
			must(t, store.Complete(fx.ctx, key, "w1", nil))
		}
	}
	status := func(key string) idem.Status {
		t.Helper()
		key = prefix + key
		o, err := store.Begin(fx.ctx, key, "probe", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if o.Status == idem.StatusStarted {
			must(t, store.Release(fx.ctx, key, "probe"))
		}
		return o.Status
	}
	// Dead jobs keyed by: a failed record, a completed one, a running one,
	// none; and one without idempotency_key whose job ID has a failed
	// record (IdempotencyConfig.Missing = MissingUseJobID).
	record("ik-failed", idem.StatusFailed)
	record("ik-done", idem.StatusCompleted)
	record("ik-running", idem.StatusInProgress)
	record("job-by-id", idem.StatusFailed)
	add := func(fields ...any) {
		t.Helper()
		fields = append([]any{"v", "1", "type", "t", "payload", "{}"}, fields...)
		fields = append(fields, "dead_reason", "permanent", "dead_error", "no such account", "dead_stream", fx.source)
		must(t, fx.rdb.XAdd(fx.ctx, &redis.XAddArgs{Stream: fx.dead, Values: fields}).Err())
	}
	for _, ik := range []string{"ik-failed", "ik-done", "ik-running", "ik-none"} {
		add("job_id", "job-"+ik, "idempotency_key", ik)
	}
	add("job_id", "job-by-id")

	out, errOut, code := runCLI(t, nil, "", "dlq", "replay", fx.source, "--idempotency-prefix", prefix, "--yes")
	mustCode(t, exitUsage, out, errOut, code)

	// Without the flag: records untouched, and the output says so.
	out, errOut, code = runCLI(t, nil, "", "dlq", "replay", fx.source, "--yes", "--rate", "0", "--limit", "1")
	mustCode(t, 0, out, errOut, code)
	if !strings.Contains(out, "idempotency records left as they were") || !strings.Contains(out, "--forget-failed-idempotency") {
		t.Errorf("replay output does not say what it did with idempotency records:\n%s", out)
	}
	if st := status("ik-failed"); st != idem.StatusFailed {
		t.Errorf("replay without --forget-failed-idempotency: record %v, want failed", st)
	}

	for _, p := range []string{prefix, "shared:idem:"} { // the default, an explicit prefix
		args := []string{"dlq", "replay", fx.source, "--dry-run", "--forget-failed-idempotency"}
		if p != prefix {
			args = append(args, "--idempotency-prefix", p)
		}
		out, errOut, code = runCLI(t, nil, "", args...)
		mustCode(t, 0, out, errOut, code)
		if want := fmt.Sprintf("would replay 4 jobs from %s to %s, forgetting their failed idempotency records under %q", fx.dead, fx.source, p); !strings.Contains(out, want) {
			t.Errorf("dry run: %q, want %q", out, want)
		}
	}
	if st := status("job-by-id"); st != idem.StatusFailed {
		t.Errorf("dry run changed a record: %v", st)
	}

	out, errOut, code = runCLI(t, nil, "", "dlq", "replay", fx.source, "--yes", "--rate", "0", "-o", "json",
		"--forget-failed-idempotency")
	mustCode(t, 0, out, errOut, code)
	var res replayJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("replay json: %v\n%s", err, out)
	}
	if res.Replayed != 4 || !res.ForgetFailedIdempotency || res.IdempotencyPrefix != prefix || res.Forgotten != 1 {
		t.Errorf("replay json %+v, want 4 replayed and 1 failed record forgotten under %q", res, prefix)
	}
	for key, want := range map[string]idem.Status{
		"ik-failed":  idem.StatusFailed, // replayed earlier, without the flag
		"ik-done":    idem.StatusCompleted,
		"ik-running": idem.StatusInProgress,
		"ik-none":    idem.StatusStarted,
		"job-by-id":  idem.StatusStarted,
	} {
		if st := status(key); st != want {
			t.Errorf("record %s after the replay: %v, want %v", key, st, want)
		}
	}
	if n := fx.rdb.XLen(fx.ctx, fx.source).Val(); n != 5 {
		t.Errorf("source stream has %d jobs, want the 5 replayed", n)
	}
}
