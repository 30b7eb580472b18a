package periodic

import (
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/stream"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Limits and defaults of a [Schedule].
const (
	// DefaultTolerance caps the default tolerance of a tick (see
	// [Schedule].Tolerance).
	DefaultTolerance = time.Minute
	// MaxHeaders is the most headers a schedule's jobs carry (the tick
	// script passes an entry's fields through Lua's unpack, which is
	// bounded).
	MaxHeaders = 1000
	// MaxNameLen is the longest schedule name, in bytes.
	MaxNameLen = 100
	// MinEvery is the shortest [Schedule].Every.
	MinEvery = time.Second
)

// Missed is what a schedule does about ticks that no scheduler enqueued
// within their tolerance (every scheduler was down, or Redis was).
type Missed int

const (
	// Skip leaves missed ticks out: the schedule goes on with its next tick.
	Skip Missed = iota
	// RunOnce enqueues one job, for the latest tick due, when a scheduler
	// starts or finds a tick missed, however many were missed: never a
	// burst. The job is late (its tolerance does not apply) and added only
	// if the schedule's record is older than its tick. A schedule that
	// never enqueued a tick has missed nothing.
	RunOnce
)

// String returns "skip" or "run-once".
func (m Missed) String() string {
	switch m {
	case Skip:
		return "skip"
	case RunOnce:
		return "run-once"
	}
	return fmt.Sprintf("Missed(%d)", int(m))
}

// Schedule is one periodic job: when it runs (Cron or Every) and the job each
// tick enqueues. The job of the tick at time t has the ID
// [JobID](Name, t), which is also its idempotency key.
type Schedule struct {
	// ContentType is the jobs' content type (see stream.Job). Defaults to ""
	// (application/json).
	ContentType string
	// Cron is a cron expression: five fields (minute, hour, day of month,
	// month, day of week), or six with seconds first, or a descriptor
	// (@hourly, @daily, @weekly, @monthly, @yearly), as parsed by
	// github.com/robfig/cron/v3, which also decides how daylight saving
	// time is handled: a time skipped by a spring-forward does not run that
	// day, a time repeated by a fall-back runs twice (two ticks, an hour
	// apart). A "CRON_TZ=<zone> " prefix sets the time zone (then Location
	// must be nil). "@every" is refused: use Every. Exactly one of Cron and
	// Every is set. Defaults to "".
	Cron string
	// Every ticks at fixed intervals, at the multiples of Every since the
	// Unix epoch (so every scheduler agrees on the ticks: Every: time.Hour
	// ticks on the hour, UTC). At least [MinEvery], a whole number of
	// milliseconds. Defaults to 0 (Cron is used).
	Every time.Duration
	// Headers are the jobs' user headers. Defaults to none.
	Headers map[string]string
	// Location is the time zone Cron is read in. Defaults to UTC (never the
	// process's local zone, so that schedulers in different zones agree).
	Location *time.Location
	// LockKey is the jobs' lock key (see middleware.Lock). Defaults to "".
	LockKey string
	// MaxAttempts caps the attempts of each job. Defaults to 0 (the
	// consumer's policy).
	MaxAttempts int
	// Missed is the policy for ticks missed while no scheduler could
	// enqueue them. Defaults to [Skip].
	Missed Missed
	// Name identifies the schedule within its stream: its markers, its
	// record and its jobs' IDs are named after it. Letters, digits, '-', '_'
	// and '.', at most [MaxNameLen] bytes. Required.
	Name string
	// Payload is every job's payload. Defaults to none.
	Payload []byte
	// Tolerance is how late, by the Redis clock, a tick may still be
	// enqueued (after a Redis error, a stalled or restarted scheduler); a
	// tick not enqueued by then is missed. A tick's tolerance never reaches
	// the next tick: it is at most the time between the two, so at any
	// moment at most one tick of a schedule can be enqueued. Defaults to
	// half the time to the next tick, at most [DefaultTolerance].
	Tolerance time.Duration
	// Type is the jobs' type. Required.
	Type string
}

// JobID returns the job ID of the tick at time tick of the schedule named
// name: name + "@" + the tick in UTC as RFC 3339 with milliseconds, such as
// "nightly-report@2026-03-08T07:30:00.000Z". The job, its retries and its
// dead letter carry it.
func JobID(name string, tick time.Time) string {
	return name + "@" + tick.UTC().Format("2006-01-02T15:04:05.000Z")
}

// cronParser parses Schedule.Cron.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// entry is a validated schedule with its parsed timing.
type entry struct {
	s    Schedule
	spec *cron.SpecSchedule // nil for Every
}

// Validate reports the first problem of s, naming the field.
func (s Schedule) Validate() error {
	if _, err := compile(s); err != nil {
		return fmt.Errorf("periodic: %w", err)
	}
	return nil
}

func compile(s Schedule) (*entry, error) {
	if err := checkName(s.Name); err != nil {
		return nil, err
	}
	field := func(f, format string, args ...any) error {
		return fmt.Errorf("Schedule %q: %s %s", s.Name, f, fmt.Sprintf(format, args...))
	}
	e := &entry{s: s}
	switch {
	case s.Type == "":
		return nil, field("Type", "is required")
	case s.Cron == "" && s.Every == 0:
		return nil, field("Cron", "or Every is required")
	case s.Cron != "" && s.Every != 0:
		return nil, field("Cron", "and Every are both set; set one")
	case s.MaxAttempts < 0:
		return nil, field("MaxAttempts", "(%d) must not be negative", s.MaxAttempts)
	case s.Tolerance < 0:
		return nil, field("Tolerance", "(%v) must not be negative", s.Tolerance)
	case s.Tolerance > 0 && s.Tolerance < time.Millisecond:
		return nil, field("Tolerance", "(%v) must be 0 or at least 1ms", s.Tolerance)
	case s.Missed != Skip && s.Missed != RunOnce:
		return nil, field("Missed", "(%d) must be Skip or RunOnce", int(s.Missed))
	case s.Every != 0 && s.Every < MinEvery:
		return nil, field("Every", "(%v) must be at least %v", s.Every, MinEvery)
	case s.Every%time.Millisecond != 0:
		return nil, field("Every", "(%v) must be a whole number of milliseconds", s.Every)
	case len(s.Headers) > MaxHeaders:
		return nil, field("Headers", "has %d entries; at most %d", len(s.Headers), MaxHeaders)
	case s.Every != 0 && s.Location != nil:
		return nil, field("Location", "is set with Every; it applies to Cron only")
	}
	if _, ok := s.Headers[""]; ok {
		return nil, field("Headers", "has an empty name (its field %q would not read back as a header)", stream.HeaderPrefix)
	}
	// Every tick's job must be one a consumer can decode: the entry's
	// fields and values, counted as stream.Decode counts them.
	size := 0
	for _, f := range stream.Encode(&stream.Job{ID: JobID(s.Name, time.Unix(0, 0)), IdempotencyKey: JobID(s.Name, time.Unix(0, 0)),
		Type: s.Type, Payload: s.Payload, ContentType: s.ContentType, MaxAttempts: s.MaxAttempts, LockKey: s.LockKey, Headers: s.Headers}) {
		switch v := f.(type) {
		case string:
			size += len(v)
		case []byte:
			size += len(v)
		default:
			size += len(fmt.Sprint(v))
		}
	}
	if size > stream.DefaultMaxEntryBytes {
		return nil, field("Payload", "with Type and Headers makes an entry of %d bytes, over stream.DefaultMaxEntryBytes (%d), which consumers refuse", size, stream.DefaultMaxEntryBytes)
	}
	if s.Cron == "" {
		return e, nil
	}
	text := strings.TrimSpace(s.Cron)
	if strings.HasPrefix(text, "@every") {
		return nil, field("Cron", "(%.60q): @every is not deterministic across schedulers; use Schedule.Every", s.Cron)
	}
	zoned := strings.HasPrefix(text, "CRON_TZ=") || strings.HasPrefix(text, "TZ=")
	if zoned && s.Location != nil {
		return nil, field("Location", "is set and Cron (%.60q) names a time zone; set one", s.Cron)
	}
	if zoned {
		// The parser panics on a time zone with no fields after it.
		if i := strings.IndexAny(text, " \t"); i < 0 || strings.TrimSpace(text[i:]) == "" {
			return nil, field("Cron", "(%.60q) names a time zone and no schedule", s.Cron)
		}
	}
	parsed, err := parseCron(text)
	if err != nil {
		return nil, field("Cron", "(%.60q) does not parse: %v", s.Cron, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, field("Cron", "(%.60q) is not a cron expression", s.Cron)
	}
	if !zoned {
		spec.Location = time.UTC
		if s.Location != nil {
			spec.Location = s.Location
		}
	}
	e.spec = spec
	// A spec that never matches (February 30th) has no tick in the
	// library's search range.
	if spec.Next(time.Now()).IsZero() {
		return nil, field("Cron", "(%.60q) never matches", s.Cron)
	}
	return e, nil
}

// checkName reports whether name may name a schedule.
func checkName(name string) error {
	if name == "" {
		return errors.New("Schedule.Name is required")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("Schedule.Name (%.40q…) is longer than %d bytes", name, MaxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("Schedule.Name (%q) may hold only letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}

// next returns the schedule's first tick strictly after t (zero if there
// is none within the cron library's search range).
func (e *entry) next(t time.Time) time.Time {
	if e.spec == nil {
		ms := e.s.Every.Milliseconds()
		return time.UnixMilli((floorDiv(t.UnixMilli(), ms) + 1) * ms)
	}
	return e.spec.Next(t)
}

// prev returns the schedule's latest tick at or before t, and false if
// there is none within about 10 years.
func (e *entry) prev(t time.Time) (time.Time, bool) {
	if e.spec == nil {
		ms := e.s.Every.Milliseconds()
		return time.UnixMilli(floorDiv(t.UnixMilli(), ms) * ms), true
	}
	// The library only searches forward: find a start lo whose next tick is
	// at or before t, then the latest such start by bisection (Next is
	// non-decreasing in its argument); its next tick is the answer.
	const horizon = 10 * 366 * 24 * time.Hour
	var lo time.Time
	found := false
	for w := time.Second; w <= horizon; w *= 2 {
		if n := e.spec.Next(t.Add(-w)); !n.IsZero() && !n.After(t) {
			lo, found = t.Add(-w), true
			break
		}
	}
	if !found {
		return time.Time{}, false
	}
	hi := t // e.spec.Next(t) is after t
	for hi.Sub(lo) > time.Millisecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if n := e.spec.Next(mid); !n.IsZero() && !n.After(t) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return e.spec.Next(lo), true
}

// tolerance returns how late the tick at t may be enqueued.
func (e *entry) tolerance(t time.Time) time.Duration {
	gap := time.Hour
	if n := e.next(t); !n.IsZero() {
		gap = n.Sub(t)
	}
	tol := e.s.Tolerance
	if tol == 0 {
		tol = min(gap/2, DefaultTolerance)
	}
	return max(min(tol, gap), time.Millisecond)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// parseCron parses text with the cron library, turning a panic of the
// library on input it did not foresee into an error.
func parseCron(text string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("the cron parser failed on it (%v)", r)
		}
	}()
	return cronParser.Parse(text)
}
