package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/periodic"
)

func TestSchedules(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	ctx := context.Background()
	key := "{" + name + "}:periodic:last"
	t.Cleanup(func() { rdb.Del(context.Background(), key) })

	out, errOut, code := runCLI(t, nil, "", "schedules", name)
	if code != 0 || !strings.Contains(out, "no schedule has enqueued a tick") {
		t.Fatalf("empty: exit %d out %q stderr %s", code, out, errOut)
	}
	tick := time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)
	must(t, rdb.HSet(ctx, key, "nightly", tick.UnixMilli(), "bad\x1b[2Jname", "x").Err())
	out, errOut, code = runCLI(t, nil, "", "schedules", name)
	if code != 0 || !strings.Contains(out, "nightly") || !strings.Contains(out, "2026-03-09 06:30:00.000") ||
		!strings.Contains(out, periodic.JobID("nightly", tick)) || strings.Contains(out, "\x1b") {
		t.Fatalf("table: exit %d out %q stderr %s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "", "schedules", name, "-o", "json")
	var res struct {
		Schedules []struct {
			Name     string  `json:"name"`
			LastTick *string `json:"last_tick"`
			JobID    *string `json:"job_id"`
		} `json:"schedules"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Schedules) != 2 {
		t.Fatalf("json: exit %d out %q stderr %s", code, out, errOut)
	}
	if s := res.Schedules[1]; s.Name != "nightly" || s.JobID == nil || *s.JobID != "nightly@2026-03-09T06:30:00.000Z" {
		t.Fatalf("json: %s", out)
	}
	if s := res.Schedules[0]; s.LastTick != nil || strings.Contains(s.Name, "\x1b") {
		t.Fatalf("json of a foreign field: %s", out)
	}
	if _, _, code := runCLI(t, nil, "", "schedules", "a}b"); code != 1 {
		t.Fatalf("bad stream name: exit %d, want 1", code)
	}
}
