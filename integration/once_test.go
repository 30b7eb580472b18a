package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestEnqueueOnce_lostReply drops the reply of an enqueue on its way back
// through a TCP proxy: Redis applied the command, the client saw the
// connection close without a reply. With the idempotency key enqueued
// once, neither go-redis's own retry nor the application's adds the job a
// second time; without it (the README's "maybe enqueued"), each retry that
// follows a lost reply adds a duplicate, which this test shows.
func TestEnqueueOnce_lostReply(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	proxy, err := faultproxy.Start(redistest.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	tests := []struct {
		name string
		once bool
		// clientRetries: go-redis retries the command itself (its default);
		// otherwise the error reaches the application, which enqueues again.
		clientRetries bool
		batch         bool
		want          int // entries per job
	}{
		{"Once/ClientRetry", true, true, false, 1},
		{"Once/AppRetry", true, false, false, 1},
		{"Once/BatchClientRetry", true, true, true, 1},
		{"Once/BatchAppRetry", true, false, true, 1},
		{"Plain/ClientRetry", false, true, false, 2},
		{"Plain/AppRetry", false, false, false, 2},
		{"Plain/BatchClientRetry", false, true, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: one proxy, armed for one request at a time.
			name := redistest.Name(t)
			keys, _ := stream.KeysFor(name)
			opts := &redis.Options{Addr: proxy.Addr(), PoolSize: 1}
			if !tt.clientRetries {
				opts.MaxRetries = -1
			}
			rdb := redis.NewClient(opts)
			defer rdb.Close()
			ctx := context.Background()
			if err := rdb.Ping(ctx).Err(); err != nil { // an idle connection for the request
				t.Fatal(err)
			}
			cfg := stream.ProducerConfig{Stream: name}
			if tt.once {
				cfg.EnqueueOnce = time.Hour
			}
			p := stream.NewProducer(rdb, cfg)
			n := 1
			if tt.batch {
				n = 50
			}
			var jobs []*stream.Job
			var del []string
			for i := range n {
				k := fmt.Sprintf("op-%d", i)
				jobs = append(jobs, &stream.Job{Type: "t", IdempotencyKey: k})
				del = append(del, keys.Once+k)
			}
			t.Cleanup(func() { shared.Del(context.Background(), append(del, name)...) })
			// The script when once (EVAL until Redis has run it, then
			// EVALSHA: "eval" matches both), else XADD.
			proxy.DropReplies(1, map[bool]string{true: "eval", false: "xadd"}[tt.once])
			enqueue := func() ([]string, error) {
				if tt.batch {
					return p.EnqueueBatch(ctx, jobs)
				}
				id, err := p.Enqueue(ctx, jobs[0])
				return []string{id}, err
			}
			ids, err := enqueue()
			if proxy.DropsLeft() != 0 {
				t.Fatal("no reply was dropped")
			}
			switch {
			case tt.clientRetries && err != nil:
				t.Fatalf("enqueue with go-redis retrying: %v", err)
			case !tt.clientRetries && (err == nil || !strings.Contains(err.Error(), "outcome unknown")):
				t.Fatalf("enqueue without retries: %v; want an outcome-unknown error", err)
			case !tt.clientRetries:
				ids, err = enqueue() // the application retries
				if err != nil {
					t.Fatalf("retried enqueue: %v", err)
				}
			}
			msgs, err := shared.XRange(ctx, name, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			per := map[string]int{}
			for _, m := range msgs {
				per[m.Values[stream.FieldIdempotencyKey].(string)]++
			}
			for _, j := range jobs {
				if per[j.IdempotencyKey] != tt.want {
					t.Errorf("job %s is in the stream %d times; want %d", j.IdempotencyKey, per[j.IdempotencyKey], tt.want)
				}
			}
			if tt.once && len(msgs) == len(jobs) {
				// The retry's answer is the first (applied) enqueue's.
				for i, m := range msgs {
					if ids[i] != m.ID || jobs[i].ID != m.Values[stream.FieldJobID] {
						t.Errorf("job %d: enqueue returned %q (job %s); the stream holds %q (job %v)", i, ids[i], jobs[i].ID, m.ID, m.Values[stream.FieldJobID])
					}
				}
			}
		})
	}
}

// TestEnqueueOnce_snippet runs docs/snippets/enqueue-once.sh (the
// redis-cli form of the enqueue-once contract, in docs/wire-format.md
// verbatim) twice: the first run adds the job, the second adds nothing and
// prints the first job's IDs.
func TestEnqueueOnce_snippet(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli is not installed (%v): %s", err, wireDepsHint)
	}
	doc, err := os.ReadFile("../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	snippet, err := os.ReadFile(filepath.Join(wireSnippets, "enqueue-once.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, snippet) {
		t.Error("docs/wire-format.md does not contain docs/snippets/enqueue-once.sh verbatim")
	}
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	marker, _ := stream.OnceKey(name, "invoice-1042-send")
	t.Cleanup(func() { rdb.Del(context.Background(), name, marker) })
	host, port, _ := net.SplitHostPort(redistest.Addr())
	run := func() []string {
		cmd := exec.Command("bash", "enqueue-once.sh")
		cmd.Dir = wireSnippets
		cmd.Env = append(os.Environ(), "REDIS_HOST="+host, "REDIS_PORT="+port, "PELICAN_STREAM="+name)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("enqueue-once.sh: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	first, second := run(), run()
	msgs := rdb.XRange(context.Background(), name, "-", "+").Val()
	if len(msgs) != 1 {
		t.Fatalf("the stream holds %d entries after two runs; want 1", len(msgs))
	}
	want := []string{msgs[0].ID, fmt.Sprint(msgs[0].Values[stream.FieldJobID])}
	if fmt.Sprint(first) != fmt.Sprint(append(want, "0")) || fmt.Sprint(second) != fmt.Sprint(append(want, "1")) {
		t.Errorf("runs printed %q and %q; want %q then the same with 1", first, second, append(want, "0"))
	}
	job, err := stream.Decode(msgs[0].ID, msgs[0].Values)
	if err != nil || job.Type != "invoice.send" || job.IdempotencyKey != "invoice-1042-send" {
		t.Errorf("entry decodes to %+v, %v", job, err)
	}
}
