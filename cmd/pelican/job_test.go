package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// job and cancel through the CLI: a scheduled tracked job is shown with its
// due time, cancelled, then shown cancelled; cancelling again exits 1, an
// unknown job exits 4 for both; bad arguments exit 2 before Redis is
// touched.
func TestJob_cli(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	ctx := context.Background()
	p := stream.NewProducer(q.rdb, stream.ProducerConfig{Stream: q.name, Track: true})
	j := &stream.Job{Type: "email", Payload: []byte(`{}`)}
	if err := p.EnqueueIn(ctx, j, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.rdb.Del(context.Background(), stream.JobKey(q.keys, j.ID)) })
	if out, errOut, code := runCLI(t, nil, "", "job", q.name, j.ID); code != 0 || !strings.Contains(out, "scheduled") || !strings.Contains(out, "due") {
		t.Fatalf("job: exit %d out %q stderr %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, nil, "", "cancel", q.name, j.ID); code != 0 || !strings.Contains(out, "was scheduled") {
		t.Fatalf("cancel: exit %d out %q stderr %s", code, out, errOut)
	}
	out, errOut, code := runCLI(t, nil, "", "job", q.name, j.ID, "-o", "json")
	var v jobView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.State != stream.StateCancelled || v.At == nil {
		t.Fatalf("job -o json after cancel: exit %d out %s stderr %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "", "cancel", q.name, j.ID); code != exitError || !strings.Contains(errOut, "already finished") {
		t.Errorf("cancel twice: exit %d stderr %q", code, errOut)
	}
	for _, cmd := range []string{"job", "cancel"} {
		if _, errOut, code := runCLI(t, nil, "", cmd, q.name, "no-such-job"); code != exitNotFound {
			t.Errorf("%s of an unknown job: exit %d stderr %q; want %d", cmd, code, errOut, exitNotFound)
		}
		if _, errOut, code := runCLI(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "", cmd, q.name, strings.Repeat("x", 2000)); code != exitUsage {
			t.Errorf("%s of a 2000-byte ID: exit %d (%s), want %d before connecting", cmd, code, errOut, exitUsage)
		}
	}
}
