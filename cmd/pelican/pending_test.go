package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestPending_table(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	out, errOut, code := runCLI(t, nil, "", "pending", q.name, "--group", "g")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	for _, id := range q.ids[:2] {
		if !hasRow(lines, []string{id, "c1", "1", "email"}) {
			t.Errorf("no row for %s in:\n%s", id, out)
		}
	}
	if strings.Contains(out, q.ids[2]) {
		t.Errorf("acknowledged entry %s listed:\n%s", q.ids[2], out)
	}
}

func TestPending_json(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	ctx := context.Background()
	// Deliver ids[0] a second time, to c2, and delete ids[1] from the stream.
	must(t, q.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: q.name, Group: "g", Consumer: "c2", Messages: []string{q.ids[0]}}).Err())
	must(t, q.rdb.XDel(ctx, q.name, q.ids[1]).Err())

	tests := []struct {
		name string
		args []string
		want []pendingEntry
	}{
		{"all", nil, []pendingEntry{
			{ID: q.ids[0], Consumer: "c2", Deliveries: 2, Type: "email"},
			{ID: q.ids[1], Consumer: "c1", Deliveries: 1, Deleted: true},
		}},
		{"consumer", []string{"--consumer", "c1"}, []pendingEntry{{ID: q.ids[1], Consumer: "c1", Deliveries: 1, Deleted: true}}},
		{"min deliveries", []string{"--min-deliveries", "2"}, []pendingEntry{{ID: q.ids[0], Consumer: "c2", Deliveries: 2, Type: "email"}}},
		{"limit", []string{"--limit", "1"}, []pendingEntry{{ID: q.ids[0], Consumer: "c2", Deliveries: 2, Type: "email"}}},
		{"min idle", []string{"--min-idle", "1h"}, []pendingEntry{}},
		{"start", []string{"--start", "(" + q.ids[0]}, []pendingEntry{{ID: q.ids[1], Consumer: "c1", Deliveries: 1, Deleted: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"pending", q.name, "-g", "g", "-o", "json"}, tt.args...)
			out, errOut, code := runCLI(t, nil, "", args...)
			if code != 0 {
				t.Fatalf("exit %d, stderr: %s", code, errOut)
			}
			var got []pendingEntry
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("bad json %v:\n%s", err, out)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %s, want %+v", out, tt.want)
			}
			for i := range got {
				got[i].Idle = 0
				if got[i] != tt.want[i] {
					t.Errorf("row %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestPending_errors(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	tests := []struct {
		name    string
		args    []string
		code    int
		message string
	}{
		{"unknown group", []string{"pending", q.name, "-g", "nope"}, exitNotFound, `unknown group "nope"`},
		{"unknown group filtered", []string{"pending", q.name, "-g", "nope", "--min-idle", "1h"}, exitNotFound, "unknown group"},
		{"unknown stream", []string{"pending", q.name + ":missing", "-g", "g"}, exitNotFound, "unknown stream"},
		{"wrong key type", []string{"pending", q.keys.Delayed, "-g", "g"}, exitError, "wrong key type"},
		{"no group flag", []string{"pending", q.name}, exitUsage, "group"},
		{"bad min-idle", []string{"pending", q.name, "-g", "g", "--min-idle", "30"}, exitUsage, "min-idle"},
		{"bad start", []string{"pending", q.name, "-g", "g", "--start", "yesterday"}, exitUsage, "bad entry ID"},
		{"bad limit", []string{"pending", q.name, "-g", "g", "--limit", "0"}, exitUsage, "--limit"},
		{"no stream", []string{"pending", "-g", "g"}, exitUsage, "accepts 1 arg"},
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
