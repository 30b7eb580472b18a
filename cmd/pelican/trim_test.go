package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestTrim_dryRunMatchesTrim(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	ctx := context.Background()
	// Group g: ids[0], ids[1] pending, ids[2] acked, 3 and 4 unread. Nothing
	// is removable yet: the oldest pending entry is ids[0]. Acknowledge it.
	must(t, q.rdb.XAck(ctx, q.name, "g", q.ids[0]).Err())
	// Now the horizon is ids[1] (pending): only ids[0] may go.
	out, errOut, code := runCLI(t, nil, "", "trim", q.name, "--dry-run")
	if code != 0 || !strings.Contains(out, "would remove 1 entries") {
		t.Fatalf("exit %d out %q stderr %s", code, out, errOut)
	}
	if n := q.rdb.XLen(ctx, q.name).Val(); n != 5 {
		t.Fatalf("dry run changed the stream: length %d", n)
	}
	// Acknowledge ids[1] too and read everything: horizon is the last
	// delivered entry (kept), so 4 go.
	must(t, q.rdb.XAck(ctx, q.name, "g", q.ids[1]).Err())
	must(t, q.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{q.name, ">"}}).Err())
	must(t, q.rdb.XAck(ctx, q.name, "g", q.ids[3], q.ids[4]).Err())

	out, errOut, code = runCLI(t, nil, "", "trim", q.name, "--dry-run", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d stderr %s", code, errOut)
	}
	var dry struct {
		WouldRemove int64 `json:"would_remove"`
	}
	if err := json.Unmarshal([]byte(out), &dry); err != nil {
		t.Fatal(err)
	}
	if dry.WouldRemove != 4 || q.rdb.XLen(ctx, q.name).Val() != 5 {
		t.Fatalf("dry run: %s, length %d", out, q.rdb.XLen(ctx, q.name).Val())
	}
	// --keep 1h keeps everything (all entries are seconds old).
	out, _, code = runCLI(t, nil, "", "trim", q.name, "--keep", "1h")
	if code != 0 || !strings.Contains(out, "removed 0 entries") {
		t.Fatalf("trim --keep 1h: exit %d out %q", code, out)
	}
	out, errOut, code = runCLI(t, nil, "", "trim", q.name, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d stderr %s", code, errOut)
	}
	var res struct {
		Removed int64 `json:"removed"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Removed != dry.WouldRemove {
		t.Errorf("trim removed %d, dry run said %d", res.Removed, dry.WouldRemove)
	}
	if n := q.rdb.XLen(ctx, q.name).Val(); n != 1 {
		t.Errorf("length after trim = %d, want 1", n)
	}
	out, _, _ = runCLI(t, nil, "", "trim", q.name, "--dry-run")
	if !strings.Contains(out, "would remove 0 entries") {
		t.Errorf("second dry run: %q", out)
	}
}

func TestTrim_errors(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	for _, tt := range []struct {
		args    []string
		code    int
		message string
	}{
		{[]string{"trim", q.name + ":missing"}, exitNotFound, "unknown stream"},
		{[]string{"trim", q.keys.Delayed, "--dry-run"}, exitError, "wrong key type"},
		{[]string{"trim", q.name, "--keep", "-1h"}, exitUsage, "--keep"},
		{[]string{"trim"}, exitUsage, "accepts 1 arg"},
	} {
		t.Run(fmt.Sprint(tt.args), func(t *testing.T) {
			_, errOut, code := runCLI(t, nil, "", tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.message) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", code, errOut, tt.code, tt.message)
			}
		})
	}
	if n := q.rdb.XLen(context.Background(), q.name).Val(); n != 5 {
		t.Errorf("failed trims changed the stream: length %d", n)
	}
}
