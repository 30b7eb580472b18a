package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

// attack14Schedules runs `pelican schedules` with args and returns its
// stdout, stderr and exit code.
func attack14Schedules(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(pelicanCLI(t), append([]string{"--redis", "redis://" + redistest.Addr() + "/0", "schedules"}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestAttack14_schedulesCLIHostileRecords: `pelican schedules` over records
// written by something else (not a time, overflowing, wrong key type) must
// not crash: the good record is listed with its job ID, the garbage ones
// without a time, a wrong key type exits 1 naming the problem.
func TestAttack14_schedulesCLIHostileRecords(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := redistest.Name(t)
	last := "{" + name + "}:periodic:last"
	t.Cleanup(func() { rdb.Del(ctx, last) })
	good := time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)
	rdb.HSet(ctx, last, "good", strconv.FormatInt(good.UnixMilli(), 10), "abc", "abc", "nan", "nan", "huge", "99999999999999999999", "fl", "1.5")
	out, errs, code := attack14Schedules(t, name)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	for _, want := range []string{"good@2026-03-09T06:30:00.000Z", "abc", "nan", "huge", "fl"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	js, errs, code := attack14Schedules(t, name, "--output", "json")
	var doc struct {
		Schedules []map[string]any `json:"schedules"`
	}
	if code != 0 || json.Unmarshal([]byte(js), &doc) != nil || len(doc.Schedules) != 5 {
		t.Errorf("json: exit %d, %q %s", code, js, errs)
	}
	rdb.Del(ctx, last)
	rdb.Set(ctx, last, "x", 0)
	out, errs, code = attack14Schedules(t, name)
	if code != 1 || !strings.Contains(errs, "WRONGTYPE") {
		t.Errorf("wrong key type: exit %d, %q %q, want 1 and WRONGTYPE", code, out, errs)
	}
}

// TestAttack14_schedulesCLIFutureAge: a record far in the future (a year
// past 2262, beyond time.Duration) is printed with the age
// -2562047h47m16.854775808s, the minimum Duration, rather than a bounded or
// marked value; the job ID shows a 5-digit year, not RFC 3339.
func TestAttack14_schedulesCLIFutureAge(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	name := redistest.Name(t)
	last := "{" + name + "}:periodic:last"
	t.Cleanup(func() { rdb.Del(ctx, last) })
	rdb.HSet(ctx, last, "big", strconv.FormatInt(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), 10))
	out, errs, code := attack14Schedules(t, name)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	if strings.Contains(out, "2562047h47m16.854775808s") {
		t.Errorf("the age overflowed time.Duration:\n%s", out)
	}
}
