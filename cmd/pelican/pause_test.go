package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// pause and resume through the CLI: the state written is what stats and
// the JSON output say; bad flags exit 2 before Redis is touched; a resume
// of nothing exits 4.
func TestPause_cli(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	t.Cleanup(func() { q.rdb.Del(context.Background(), q.keys.Paused) })
	if out, errOut, code := runCLI(t, nil, "", "pause", q.name); code != 0 || !strings.Contains(out, "until resumed") {
		t.Fatalf("pause: exit %d out %q stderr %s", code, out, errOut)
	}
	out, errOut, code := runCLI(t, nil, "", "pause", q.name, "--type", "email", "--for", "1h", "-o", "json")
	if code != 0 {
		t.Fatalf("pause --type: exit %d stderr %s", code, errOut)
	}
	var v struct {
		Paused []pauseView `json:"paused"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Paused) != 2 || v.Paused[0].Type != "" || v.Paused[0].Until != nil ||
		v.Paused[1].Type != "email" || v.Paused[1].Until == nil {
		t.Fatalf("pause JSON = %s (%v); want the queue until resumed and type email with an end", out, err)
	}
	if out, _, code := runCLI(t, nil, "", "stats", q.name); code != 0 || !strings.Contains(out, "PAUSED") || !strings.Contains(out, "type email") {
		t.Errorf("stats: exit %d, output without the pauses:\n%s", code, out)
	}
	for _, args := range [][]string{
		{"pause", q.name, "--for", "-1m"},
		{"pause", q.name, "--until", "yesterday"},
		{"pause", q.name, "--until", "2001-01-01T00:00:00Z"},
		{"pause", q.name, "--for", "1m", "--until", "2099-01-01T00:00:00Z"},
		{"resume", q.name, "--all", "--type", "email"},
	} {
		if _, errOut, code := runCLI(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "", args...); code != exitUsage {
			t.Errorf("%v: exit %d (%s), want %d before connecting", args, code, errOut, exitUsage)
		}
	}
	if _, errOut, code := runCLI(t, nil, "", "resume", q.name, "--all"); code != 0 {
		t.Fatalf("resume --all: exit %d stderr %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, nil, "", "resume", q.name); code != exitNotFound || !strings.Contains(errOut, "not paused") {
		t.Errorf("resume of nothing: exit %d stderr %q, want %d and 'not paused'", code, errOut, exitNotFound)
	}
	if out, _, _ := runCLI(t, nil, "", "stats", q.name); strings.Contains(out, "PAUSED") {
		t.Errorf("stats after resume still shows pauses:\n%s", out)
	}
}
