package periodic

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// Config configures a [Scheduler]. It is checked by [New] (and
// [Config.Validate]) before Redis is touched.
type Config struct {
	// Logger receives the scheduler's errors and missed ticks (never
	// payloads). Defaults to slog.Default().
	Logger *slog.Logger
	// Schedules are the periodic jobs, each with a unique Name. At least
	// one. Required.
	Schedules []Schedule
	// Stream is the stream the jobs are added to; the markers and records
	// live in its namespace ([stream.Keys].Periodic). Required.
	Stream string
}

// Validate reports the first problem of c, naming the field.
func (c Config) Validate() error {
	_, err := c.compile()
	return err
}

func (c Config) compile() ([]*entry, error) {
	if _, err := stream.KeysFor(c.Stream); err != nil {
		return nil, fmt.Errorf("periodic: Config.Stream: %w", err)
	}
	if len(c.Schedules) == 0 {
		return nil, errors.New("periodic: Config.Schedules is empty")
	}
	seen := make(map[string]bool, len(c.Schedules))
	entries := make([]*entry, 0, len(c.Schedules))
	for i, s := range c.Schedules {
		e, err := compile(s)
		if err != nil {
			return nil, fmt.Errorf("periodic: Config.Schedules[%d]: %w", i, err)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("periodic: Config.Schedules[%d]: Schedule.Name %q is used twice", i, s.Name)
		}
		seen[s.Name] = true
		entries = append(entries, e)
	}
	return entries, nil
}

// Scheduler enqueues the jobs of its schedules at their ticks. Run one in
// every process that should keep the schedules going (typically each
// consumer process): however many run, each tick's job is enqueued once.
type Scheduler struct {
	rdb     redis.UniversalClient
	keys    stream.Keys
	entries []*entry
	log     *slog.Logger
	clock   clock
	running atomic.Bool
	// offset is the Redis clock minus the local clock, in nanoseconds, as
	// a lower bound (see observe): aimed with it, a call reaches Redis no
	// earlier than aimed.
	offset atomic.Int64
	// measureMu serializes the updates of offset; measured: it holds a
	// measurement (the first one sets it).
	measureMu sync.Mutex
	measured  bool

	// observe, when set (tests), is called with the outcome of every tick
	// attempt: a status of the script, or "error" or "missed"; and with
	// "start" and the first tick it will try when a schedule's loop starts.
	observe func(name string, tick time.Time, status string, late time.Duration)
}

// New returns a scheduler of cfg's schedules on rdb. It returns an error
// naming the field of a bad cfg, and does not touch Redis.
func New(rdb redis.UniversalClient, cfg Config) (*Scheduler, error) {
	entries, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("periodic: New: nil Redis client")
	}
	keys, _ := stream.KeysFor(cfg.Stream)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Scheduler{rdb: rdb, keys: keys, entries: entries, log: log, clock: realClock{}}, nil
}

// Run enqueues ticks until ctx is cancelled, and returns nil then. Redis
// errors are logged and retried within each tick's tolerance; they never
// end Run. A Scheduler runs once at a time: a second concurrent Run
// returns an error.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("periodic: Scheduler is already running")
	}
	defer s.running.Store(false)
	for retry := 100 * time.Millisecond; ; retry = min(2*retry, 5*time.Second) {
		err := s.measure(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("periodic: cannot read the Redis clock; retrying", "stream", s.keys.Stream, "error", bounded(err))
		if s.clock.Sleep(ctx, retry) != nil {
			return nil
		}
	}
	var wg sync.WaitGroup
	for _, e := range s.entries {
		wg.Go(func() { s.loop(ctx, e) })
	}
	wg.Wait()
	return nil
}

// loop runs one schedule: it waits for each tick by the Redis clock and
// runs the tick script once, then moves on.
func (s *Scheduler) loop(ctx context.Context, e *entry) {
	now := s.now()
	tick, catchUp := s.resume(e, now, time.Time{})
	if s.observe != nil {
		s.observe(e.s.Name, tick, "start", now.Sub(tick))
	}
	retry := 100 * time.Millisecond
	for ctx.Err() == nil {
		if tick.IsZero() {
			s.log.Warn("periodic: schedule has no further tick", "schedule", e.s.Name)
			return
		}
		if s.waitUntil(ctx, tick) != nil {
			return
		}
		status, now, err := s.run(ctx, e, tick, catchUp)
		if s.observe != nil {
			o := status
			if err != nil {
				o = "error"
			}
			s.observe(e.s.Name, tick, o, now.Sub(tick))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Retry until the tick's tolerance ends (a catch-up: until
			// the next tick is due).
			now = s.now()
			end := tick.Add(e.tolerance(tick))
			if catchUp {
				end = e.next(tick)
			}
			if now.Before(end) {
				s.log.Warn("periodic: tick not enqueued; retrying", "schedule", e.s.Name, "tick", tick, "error", bounded(err))
				d := min(retry, end.Sub(now))
				retry = min(2*retry, 5*time.Second)
				if s.clock.Sleep(ctx, d) != nil {
					return
				}
				continue
			}
			retry = 100 * time.Millisecond
			s.log.Warn("periodic: tick given up after errors (another scheduler may have enqueued it)", "schedule", e.s.Name, "tick", tick, "error", bounded(err))
			if catchUp {
				tick, catchUp = e.next(tick), false
			} else {
				tick, catchUp = s.resume(e, now, tick)
			}
			continue
		}
		retry = 100 * time.Millisecond
		switch status {
		case "early":
			// The offset was off: the reply measured it again.
			if s.clock.Sleep(ctx, max(tick.Sub(now), time.Millisecond)) != nil {
				return
			}
		case "late":
			if !catchUp {
				s.log.Warn("periodic: tick missed", "schedule", e.s.Name, "tick", tick, "tolerance", e.tolerance(tick), "missed", e.s.Missed.String())
				if s.observe != nil {
					s.observe(e.s.Name, tick, "missed", now.Sub(tick))
				}
				tick, catchUp = s.resume(e, now, tick)
				continue
			}
			tick, catchUp = e.next(tick), false
		default: // added, duplicate, stale
			if status == "added" {
				s.log.Debug("periodic: tick enqueued", "schedule", e.s.Name, "tick", tick, "job_id", JobID(e.s.Name, tick))
			}
			tick, catchUp = e.next(tick), false
		}
	}
}

// resume returns the tick to run next at time now, and whether it is a
// catch-up. missed is the tick just missed (zero at start): the latest tick
// is run if it is still within its tolerance (and after missed); else, with
// RunOnce, the latest tick (missed included) as a catch-up, which the
// script refuses unless the schedule's record is older; else the next tick.
func (s *Scheduler) resume(e *entry, now, missed time.Time) (time.Time, bool) {
	if last, ok := e.prev(now); ok {
		if last.After(missed) && now.Before(last.Add(e.tolerance(last))) {
			return last, false
		}
		if e.s.Missed == RunOnce && !last.Before(missed) {
			return last, true
		}
	}
	next := e.next(now)
	if !missed.IsZero() && !next.IsZero() && !next.After(missed) {
		next = e.next(missed)
	}
	return next, false
}

// waitUntil sleeps until tick by the Redis clock (as this process measures
// it), a little after to absorb the measurement's error, in steps of at
// most 10 minutes, measuring the clock offset again after a long step.
func (s *Scheduler) waitUntil(ctx context.Context, tick time.Time) error {
	const step, margin = 10 * time.Minute, 2 * time.Millisecond
	for {
		d := tick.Sub(s.now()) + margin
		if d <= margin {
			return ctx.Err()
		}
		if err := s.clock.Sleep(ctx, min(d, step)); err != nil {
			return err
		}
		if d > time.Minute {
			_ = s.measure(ctx) // on error, the script's reply measures it
		}
	}
}

// now returns the Redis time as this process estimates it.
func (s *Scheduler) now() time.Time {
	return s.clock.Now().Add(time.Duration(s.offset.Load()))
}

// measure measures the clock offset with Redis TIME.
func (s *Scheduler) measure(ctx context.Context) error {
	t0 := s.clock.Now()
	rt, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	s.measuredAt(t0, s.clock.Now(), rt, time.Microsecond)
	return nil
}

// measuredAt takes in a reading rt of the Redis clock, truncated to res,
// made between the local times t0 and t1 (a call sent and its reply read):
// the offset was at least rt-t1 and less than rt+res-t0. The offset moves
// only when a reading proves it wrong (a local clock stepped), and then to
// the least value the reading allows. So it stays a lower bound, its error
// is at most the fastest round trip since, and a slow one (a busy machine
// that sent the call late or read the reply late) does not move it: aimed
// by the round trip's middle instead, a call whose send had been delayed
// set the next tick early by up to half its round trip, and the script
// refused it early (TestScheduler_skewedClocks).
func (s *Scheduler) measuredAt(t0, t1, rt time.Time, res time.Duration) {
	lo, hi := int64(rt.Sub(t1)), int64(rt.Add(res).Sub(t0))
	s.measureMu.Lock()
	defer s.measureMu.Unlock()
	if cur := s.offset.Load(); !s.measured || cur < lo || cur >= hi {
		s.offset.Store(lo)
		s.measured = true
	}
}

var (
	//go:embed tick.lua
	tickLua    string
	tickScript = redis.NewScript(tickLua)
)

// markerTTL is how much longer than a tick's tolerance its marker lives.
const markerTTL = time.Minute

// callTimeout bounds one tick script call.
const callTimeout = 5 * time.Second

// run runs the tick script for tick, and returns its status and the Redis
// time it read (measuring the clock offset again).
func (s *Scheduler) run(ctx context.Context, e *entry, tick time.Time, catchUp bool) (string, time.Time, error) {
	id := JobID(e.s.Name, tick)
	job := &stream.Job{
		ID: id, IdempotencyKey: id, Type: e.s.Type, Payload: e.s.Payload, ContentType: e.s.ContentType,
		MaxAttempts: e.s.MaxAttempts, LockKey: e.s.LockKey, Headers: e.s.Headers,
	}
	tol := e.tolerance(tick)
	ms := tick.UnixMilli()
	c := "0"
	if catchUp {
		c = "1"
	}
	args := []any{ms, tol.Milliseconds(), c, (tol + markerTTL).Milliseconds(), e.s.Name}
	args = append(args, stream.Encode(job)...)
	keys := []string{s.keys.Stream, s.markerKey(e.s.Name, ms), s.keys.Periodic + "last"}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	t0 := s.clock.Now()
	v, err := tickScript.Run(cctx, s.rdb, keys, args...).Slice()
	t1 := s.clock.Now()
	if err != nil {
		return "", time.Time{}, err
	}
	if len(v) < 2 {
		return "", time.Time{}, fmt.Errorf("tick script returned %d values", len(v))
	}
	status, ok1 := v[0].(string)
	nowMS, ok2 := v[1].(int64)
	if !ok1 || !ok2 {
		return "", time.Time{}, errors.New("tick script returned an unexpected reply")
	}
	now := time.UnixMilli(nowMS)
	s.measuredAt(t0, t1, now, time.Millisecond)
	return status, now, nil
}

// markerKey returns the marker of the tick at ms of schedule name.
func (s *Scheduler) markerKey(name string, ms int64) string {
	return s.keys.Periodic + "tick:" + name + ":" + strconv.FormatInt(ms, 10)
}

// bounded returns err's text cut to 200 bytes for a log.
func bounded(err error) string {
	m := err.Error()
	if len(m) > 200 {
		m = m[:200] + "…"
	}
	return m
}

// clock is the scheduler's local time source (a fake one in tests).
type clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
