package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func newStreamName(t *testing.T) (string, stream.Keys) {
	t.Helper()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	keys, err := stream.KeysFor(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), keys.Stream, keys.Dead, keys.Delayed) })
	return name, keys
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	name, keys := newStreamName(t)

	out, errOut, code := runCLI(t, nil, "", "enqueue", name, "--type", "email", "--payload", `{"to":"a@b"}`, "--idempotency-key", "k1")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	msgs, err := rdb.XRange(ctx, name, id, id).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("entry %s: %v %v", id, msgs, err)
	}
	j, err := stream.Decode(id, msgs[0].Values)
	if err != nil {
		t.Fatal(err)
	}
	if j.Type != "email" || string(j.Payload) != `{"to":"a@b"}` || j.IdempotencyKey != "k1" || j.ContentType != stream.ContentTypeJSON {
		t.Errorf("job = %+v", j)
	}

	out, errOut, code = runCLI(t, nil, `{"n":2}`, "enqueue", name, "-t", "email", "-p", "-", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	var res struct {
		EntryID string `json:"entry_id"`
		JobID   string `json:"job_id"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.EntryID == "" || res.JobID == "" {
		t.Fatalf("json %q: %v", out, err)
	}
	msgs, _ = rdb.XRange(ctx, name, res.EntryID, res.EntryID).Result()
	if len(msgs) != 1 || msgs[0].Values[stream.FieldJobID] != res.JobID || msgs[0].Values[stream.FieldPayload] != `{"n":2}` {
		t.Errorf("entry = %+v, want job %s", msgs, res.JobID)
	}

	out, errOut, code = runCLI(t, nil, "", "enqueue", name, "-t", "report", "-p", "{}", "--in", "5m")
	if code != 0 || !strings.HasPrefix(out, "scheduled ") || !strings.Contains(out, " in 5m") {
		t.Fatalf("exit %d, out %q, stderr: %s", code, out, errOut)
	}
	if n := rdb.ZCard(ctx, keys.Delayed).Val(); n != 1 {
		t.Errorf("delayed = %d, want 1", n)
	}
	if n := rdb.XLen(ctx, name).Val(); n != 2 {
		t.Errorf("stream length = %d, want 2", n)
	}
}

func TestEnqueue_errors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	name, keys := newStreamName(t)
	str := redistest.Name(t)
	must(t, rdb.Set(ctx, str, "x", 0).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), str) })

	tests := []struct {
		name    string
		args    []string
		code    int
		message string
	}{
		{"invalid json", []string{"enqueue", name, "-t", "e", "-p", "{nope"}, exitUsage, "not valid JSON"},
		{"invalid json delayed", []string{"enqueue", name, "-t", "e", "-p", "", "--in", "1m"}, exitUsage, "not valid JSON"},
		{"no type", []string{"enqueue", name, "-p", "{}"}, exitUsage, "type"},
		{"bad in", []string{"enqueue", name, "-t", "e", "-p", "{}", "--in", "5"}, exitUsage, "--in"},
		{"wrong key type", []string{"enqueue", str, "-t", "e", "-p", "{}"}, exitError, "wrong key type"},
		{"unreachable", []string{"--redis", "redis://user:hunter2@127.0.0.1:1/0", "enqueue", name, "-t", "e", "-p", "{}"}, exitError, "unreachable at redis://user:xxxxx@127.0.0.1:1/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := runCLI(t, nil, "", tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.message) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", code, errOut, tt.code, tt.message)
			}
			if strings.Contains(errOut, "hunter2") {
				t.Errorf("password in stderr: %s", errOut)
			}
		})
	}
	if n := rdb.Exists(ctx, keys.Stream, keys.Delayed).Val(); n != 0 {
		t.Errorf("failed enqueues left %d keys behind", n)
	}
}
