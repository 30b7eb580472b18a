package periodic_test

// Outside tests of package periodic (attack14): written from README.md
// ("Periodic jobs"), docs/wire-format.md (periodic section) and go doc only.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/periodic"
	"github.com/pelicanqueue/pelican/stream"
)

// ---------- a scheduler subprocess of the test binary ----------

const atkChildEnv = "ATK14_PERIODIC_CHILD"

// init runs before TestMain: when the test binary is started as an attack14
// child it runs one scheduler (schedule "hb" on ATK14_STREAM, Every
// ATK14_EVERY_MS, Tolerance ATK14_TOL_MS, Missed run-once if ATK14_MISSED
// says so) until SIGTERM and exits.
func init() {
	if os.Getenv(atkChildEnv) == "" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("ATK14_REDIS")})
	every, _ := strconv.Atoi(os.Getenv("ATK14_EVERY_MS"))
	tol, _ := strconv.Atoi(os.Getenv("ATK14_TOL_MS"))
	missed := periodic.Skip
	if os.Getenv("ATK14_MISSED") == "run-once" {
		missed = periodic.RunOnce
	}
	s, err := periodic.New(rdb, periodic.Config{Stream: os.Getenv("ATK14_STREAM"), Schedules: []periodic.Schedule{{
		Name: "hb", Type: "ping", Every: time.Duration(every) * time.Millisecond,
		Tolerance: time.Duration(tol) * time.Millisecond, Missed: missed, Payload: []byte(`"child"`),
	}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	stop()
	_ = rdb.Close()
	os.Exit(0)
}

type atkChild struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startAtkChild(t *testing.T, env ...string) *atkChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), atkChildEnv+"=1"), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &atkChild{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT); c.kill() })
	return c
}

func (c *atkChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *atkChild) term(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		if st := c.cmd.ProcessState; st != nil && st.ExitCode() != 0 {
			t.Errorf("scheduler process exited with %v", st)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("scheduler process did not exit within 30s of SIGTERM")
		c.kill()
	}
}

// ---------- helpers ----------

type atkBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *atkBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *atkBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func atkStream(t *testing.T, rdb redis.UniversalClient) string {
	name := "{" + redistest.Name(t) + "}"
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	return name
}

func atkKeys(t *testing.T, streamName string) stream.Keys {
	k, err := stream.KeysFor(streamName)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// runSched starts s.Run in a goroutine; the returned stop cancels it and
// checks that Run returned nil promptly.
func runSched(t *testing.T, rdb redis.UniversalClient, cfg periodic.Config) (stop func()) {
	t.Helper()
	s, err := periodic.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run returned %v after cancel, want nil", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return within 15s of its context's cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pjob is one periodic entry of a stream.
type pjob struct {
	entryID string
	entryMs int64
	sched   string
	tick    int64
	job     *stream.Job
}

func atkEntries(t *testing.T, rdb redis.UniversalClient, streamName string) []pjob {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), streamName, "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", streamName, err)
	}
	var out []pjob
	for _, m := range msgs {
		j, err := stream.Decode(m.ID, m.Values)
		if err != nil {
			t.Fatalf("entry %s does not decode: %v (%v)", m.ID, err, m.Values)
		}
		at := strings.LastIndex(j.ID, "@")
		if at < 0 {
			t.Fatalf("job ID %q has no @", j.ID)
		}
		ts, err := time.Parse("2006-01-02T15:04:05.000Z", j.ID[at+1:])
		if err != nil {
			t.Fatalf("job ID %q: the tick is not RFC 3339 with ms in UTC: %v", j.ID, err)
		}
		if j.IdempotencyKey != j.ID {
			t.Errorf("entry %s: idempotency_key %q != job_id %q", m.ID, j.IdempotencyKey, j.ID)
		}
		if want := periodic.JobID(j.ID[:at], ts); want != j.ID {
			t.Errorf("entry %s: job ID %q, JobID gives %q", m.ID, j.ID, want)
		}
		et, ok := stream.EntryTime(m.ID)
		if !ok {
			t.Fatalf("entry ID %q has no time", m.ID)
		}
		out = append(out, pjob{entryID: m.ID, entryMs: et.UnixMilli(), sched: j.ID[:at], tick: ts.UnixMilli(), job: j})
	}
	return out
}

func countSched(es []pjob, name string) int {
	n := 0
	for _, e := range es {
		if e.sched == name {
			n++
		}
	}
	return n
}

// checkInvariants checks what holds of any run: one job per tick, none early
// by the entry's Redis time, the ticks of a schedule strictly increasing in
// stream order (the record is only raised), each on the schedule's grid.
// With skipTol > 0 (Skip policy, no catch-up), no entry is later than that
// tolerance. It returns the entries by schedule.
func checkInvariants(t *testing.T, es []pjob, every map[string]int64, skipTol map[string]int64) map[string][]pjob {
	t.Helper()
	by := map[string][]pjob{}
	seen := map[string]string{}
	for _, e := range es {
		if prev, dup := seen[e.job.ID]; dup {
			t.Errorf("tick %s enqueued twice: entries %s and %s", e.job.ID, prev, e.entryID)
		}
		seen[e.job.ID] = e.entryID
		if e.entryMs < e.tick {
			t.Errorf("job %s enqueued early: entry %s is %d ms before its tick (Redis time)", e.job.ID, e.entryID, e.tick-e.entryMs)
		}
		if ev, ok := every[e.sched]; ok && ev > 0 && e.tick%ev != 0 {
			t.Errorf("job %s: tick %d is not a multiple of Every (%d ms)", e.job.ID, e.tick, ev)
		}
		if tol, ok := skipTol[e.sched]; ok && tol > 0 && e.entryMs-e.tick > tol {
			t.Errorf("job %s enqueued %d ms after its tick, past its tolerance %d ms (a stale tick)", e.job.ID, e.entryMs-e.tick, tol)
		}
		if l := by[e.sched]; len(l) > 0 && l[len(l)-1].tick >= e.tick {
			t.Errorf("schedule %s: tick %d enqueued after tick %d (record not only raised)", e.sched, e.tick, l[len(l)-1].tick)
		}
		by[e.sched] = append(by[e.sched], e)
	}
	return by
}

func waitCount(t *testing.T, rdb redis.UniversalClient, streamName, sched string, n int, timeout time.Duration) {
	t.Helper()
	poll.Until(t, timeout, func() (bool, string) {
		msgs, err := rdb.XRange(context.Background(), streamName, "-", "+").Result()
		if err != nil {
			return false, err.Error()
		}
		c := 0
		for _, m := range msgs {
			if id, _ := m.Values["job_id"].(string); strings.HasPrefix(id, sched+"@") {
				c++
			}
		}
		return c >= n, fmt.Sprintf("schedule %s has %d jobs on %s, want %d", sched, c, streamName, n)
	})
}

func redisNowMs(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

func markers(t *testing.T, rdb redis.UniversalClient, k stream.Keys) []string {
	t.Helper()
	var out []string
	iter := rdb.Scan(context.Background(), 0, k.Periodic+"tick:*", 1000).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ---------- validation ----------

// commandCounter is a go-redis hook counting the commands a client sent.
type commandCounter struct {
	mu sync.Mutex
	n  int
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		c.n += len(cmds)
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestAttack14_validationNamesField tries inputs the internal table does not:
// an entry too big for any consumer to decode, odd header names, a TZ=
// prefix beside Location, odd cron texts. Each must be refused by New with an
// error naming the field, without a command sent to Redis.
func TestAttack14_validationNamesField(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	ok := periodic.Schedule{Name: "a", Every: time.Second, Type: "t"}
	with := func(f func(*periodic.Schedule)) periodic.Config {
		s := ok
		f(&s)
		return periodic.Config{Stream: "q", Schedules: []periodic.Schedule{s}}
	}
	for _, tt := range []struct {
		name  string
		cfg   periodic.Config
		field string
	}{
		{"TZ= beside Location", with(func(s *periodic.Schedule) { s.Every, s.Cron, s.Location = 0, "TZ=UTC 0 * * * *", ny }), "Location"},
		{"seven fields", with(func(s *periodic.Schedule) { s.Every, s.Cron = 0, "0 0 0 * * * *" }), "Cron"},
		{"whitespace cron", with(func(s *periodic.Schedule) { s.Every, s.Cron = 0, "   " }), "Cron"},
		{"every lowercase", with(func(s *periodic.Schedule) { s.Every, s.Cron = 0, "@EVERY 5s" }), "Cron"},
		{"name with space", with(func(s *periodic.Schedule) { s.Name = "a b" }), "Name"},
		{"name with @", with(func(s *periodic.Schedule) { s.Name = "a@b" }), "Name"},
		{"name with star", with(func(s *periodic.Schedule) { s.Name = "a*" }), "Name"},
		{"name with newline", with(func(s *periodic.Schedule) { s.Name = "a\nb" }), "Name"},
		{"name unicode", with(func(s *periodic.Schedule) { s.Name = "é" }), "Name"},
		{"every huge not ms", with(func(s *periodic.Schedule) { s.Every = 1<<62 + 1 }), "Every"},
		{"missed negative", with(func(s *periodic.Schedule) { s.Missed = -1 }), "Missed"},
		{"duplicate names far apart", periodic.Config{Stream: "q", Schedules: []periodic.Schedule{ok, {Name: "b", Every: time.Second, Type: "t"}, ok}}, "Name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cc commandCounter
			rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
			defer rdb.Close()
			rdb.AddHook(&cc)
			_, err := periodic.New(rdb, tt.cfg)
			if err == nil {
				t.Fatalf("New accepted it, want an error naming %s", tt.field)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("New: %v, want an error naming %s", err, tt.field)
			}
			if len(err.Error()) > 2000 {
				t.Errorf("error is %d bytes long (the bad value is not bounded)", len(err.Error()))
			}
			if cc.n != 0 {
				t.Errorf("New sent %d commands to Redis", cc.n)
			}
		})
	}
}

// TestAttack14_cronTZWithoutFields: a Cron of only a time-zone prefix
// ("CRON_TZ=UTC", "TZ=", ...) must be refused by Validate and New with an
// error naming Schedule.Cron. It panics inside robfig/cron's parser instead
// (slice bounds out of range [:-1]), out of New and Validate.
func TestAttack14_cronTZWithoutFields(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"CRON_TZ=UTC", "CRON_TZ=America/New_York", "CRON_TZ=", "TZ=UTC", "TZ=", "CRON_TZ=UTC "} {
		cfg := periodic.Config{Stream: "q", Schedules: []periodic.Schedule{{Name: "a", Type: "t", Cron: c}}}
		for _, call := range []struct {
			what string
			f    func() error
		}{
			{"Validate", cfg.Validate},
			{"New", func() error {
				_, err := periodic.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), cfg)
				return err
			}},
		} {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s with Cron %q panicked: %v", call.what, c, r)
					}
				}()
				if err := call.f(); err == nil || !strings.Contains(err.Error(), "Cron") {
					t.Errorf("%s with Cron %q: %v, want an error naming Cron", call.what, c, err)
				}
			}()
		}
	}
}

// TestAttack14_entryTooBigForConsumers: a schedule whose job can never be
// decoded by a consumer (an entry over stream.DefaultMaxEntryBytes, which
// Decode refuses and the consumer dead-letters) is accepted by New: every
// tick then enqueues a job that is dead-lettered unrun. New should refuse
// it, naming the field.
func TestAttack14_entryTooBigForConsumers(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), stream.DefaultMaxEntryBytes+1)
	for _, s := range []periodic.Schedule{
		{Name: "p", Type: "t", Every: time.Second, Payload: big},
		{Name: "h", Type: "t", Every: time.Second, Headers: map[string]string{"k": string(big)}},
		{Name: "t", Type: string(big), Every: time.Second},
	} {
		_, err := periodic.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), periodic.Config{Stream: "q", Schedules: []periodic.Schedule{s}})
		if err == nil {
			t.Errorf("schedule %s: New accepted a job of more than %d bytes, which stream.Decode refuses", s.Name, stream.DefaultMaxEntryBytes)
		}
	}
	// what a consumer makes of such a job
	if _, err := stream.Decode("1-0", map[string]any{"type": "t", "payload": string(big)}); err == nil {
		t.Errorf("Decode accepted the entry: the limit is not what the docs say")
	}
}

// TestAttack14_emptyHeaderName: a header named "" is accepted by New, but
// its field "h." does not decode as a header (stream.Decode puts it in
// Extra): the consumer's job does not carry the header the schedule set.
func TestAttack14_emptyHeaderName(t *testing.T) {
	t.Parallel()
	_, err := periodic.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), periodic.Config{Stream: "q", Schedules: []periodic.Schedule{{Name: "a", Type: "t", Every: time.Second, Headers: map[string]string{"": "v"}}}})
	if err == nil {
		j, derr := stream.Decode("1-0", map[string]any{"type": "t", "h.": "v"})
		if derr == nil && j.Headers[""] != "v" {
			t.Errorf("New accepted a header named \"\", which the job read back does not carry as a header (Extra: %v)", j.Extra)
		}
	}
}

// TestAttack14_validAccepted: inputs the docs allow must be accepted by New
// without touching Redis.
func TestAttack14_validAccepted(t *testing.T) {
	t.Parallel()
	for _, s := range []periodic.Schedule{
		{Name: strings.Repeat("n", periodic.MaxNameLen), Type: "t", Every: time.Second},
		{Name: "a.b-c_D9", Type: "t", Every: 24 * time.Hour},
		{Name: ".", Type: "t", Cron: "@hourly", Location: time.Local},
		{Name: "x", Type: "t", Cron: "CRON_TZ=Asia/Kathmandu */2 * * * * *"},
		{Name: "h", Type: "t", Every: time.Second, Headers: func() map[string]string {
			m := map[string]string{}
			for i := range periodic.MaxHeaders {
				m["k"+strconv.Itoa(i)] = "v"
			}
			return m
		}()},
	} {
		var cc commandCounter
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
		rdb.AddHook(&cc)
		if _, err := periodic.New(rdb, periodic.Config{Stream: "q", Schedules: []periodic.Schedule{s}}); err != nil {
			t.Errorf("New(%q): %v, want nil", s.Name, err)
		}
		if cc.n != 0 {
			t.Errorf("New(%q) sent %d commands", s.Name, cc.n)
		}
		rdb.Close()
	}
}

// ---------- many schedulers ----------

// TestAttack14_manySchedulers runs 8 schedulers (each with its own client)
// of the same two schedules (Every 1 s and a seconds cron in a +05:45 zone)
// for a few seconds: every tick once, none early, job fields as configured,
// job IDs as documented; no log line holds the payload.
func TestAttack14_manySchedulers(t *testing.T) {
	t.Parallel()
	shared := redistest.Shared(t)
	name := atkStream(t, shared)
	secret := "SECRET-" + strconv.FormatUint(rand.Uint64(), 16)
	var logs atkBuf
	cfg := periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{
		{Name: "ev", Type: "ping", Every: time.Second, Payload: []byte(`{"s":"` + secret + `"}`), Headers: map[string]string{"a": "1", "b": "2"}, LockKey: "lk", MaxAttempts: 3, ContentType: "application/json"},
		{Name: "cr", Type: "cron.ping", Cron: "CRON_TZ=Asia/Kathmandu */2 * * * * *"},
	}}
	var stops []func()
	for range 8 {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
		t.Cleanup(func() { c.Close() })
		stops = append(stops, runSched(t, c, cfg))
	}
	waitCount(t, shared, name, "ev", 5, 60*time.Second)
	waitCount(t, shared, name, "cr", 2, 60*time.Second)
	for _, s := range stops {
		s()
	}
	es := atkEntries(t, shared, name)
	checkInvariants(t, es, map[string]int64{"ev": 1000, "cr": 2000}, map[string]int64{"ev": 500, "cr": 1000})
	for _, e := range es {
		j := e.job
		switch e.sched {
		case "ev":
			if j.Type != "ping" || !strings.Contains(string(j.Payload), secret) || j.LockKey != "lk" || j.MaxAttempts != 3 || j.Headers["a"] != "1" || j.Headers["b"] != "2" {
				t.Errorf("job %s fields: type %q payload %q lock %q attempts %d headers %v", j.ID, j.Type, j.Payload, j.LockKey, j.MaxAttempts, j.Headers)
			}
		case "cr":
			if j.Type != "cron.ping" {
				t.Errorf("job %s type %q", j.ID, j.Type)
			}
		default:
			t.Errorf("unexpected job %s", j.ID)
		}
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the logs hold the payload:\n%s", logs.String())
	}
}

// ---------- tolerance, by the marker's TTL ----------

// TestAttack14_toleranceCappedByInterval: the marker's TTL is the tolerance
// plus a minute, and a tolerance never reaches the next tick. A Tolerance of
// an hour on a 2 s schedule must give markers of at most 62 s; the default
// (half the interval) about 61 s.
func TestAttack14_toleranceCappedByInterval(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	k := atkKeys(t, name)
	runSched(t, rdb, periodic.Config{Stream: name, Schedules: []periodic.Schedule{
		{Name: "big", Type: "t", Every: 2 * time.Second, Tolerance: time.Hour},
		{Name: "def", Type: "t", Every: 2 * time.Second},
	}})
	waitCount(t, rdb, name, "big", 1, 60*time.Second)
	waitCount(t, rdb, name, "def", 1, 60*time.Second)
	for _, m := range markers(t, rdb, k) {
		ttl, err := rdb.PTTL(context.Background(), m).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Errorf("marker %s has no TTL (%v)", m, ttl)
		}
		limit := 62 * time.Second
		if strings.Contains(m, "tick:def:") {
			limit = 61 * time.Second
		}
		if ttl > limit {
			t.Errorf("marker %s TTL %v > %v: the tolerance was not capped at the interval", m, ttl, limit)
		}
		v, _ := rdb.Get(context.Background(), m).Result()
		if _, err := stream.ParseID(v); err != nil {
			t.Errorf("marker %s holds %q, not an entry ID", m, v)
		}
	}
}

// ---------- lifecycle ----------

func schedGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "pelican/periodic.") && !strings.Contains(g, "pelican/periodic.Test") &&
			!strings.Contains(g, "periodic_test.") {
			n++
		}
	}
	return n
}

// TestAttack14_runLifecycle: a second concurrent Run errors (and does not
// disturb the first); cancel returns nil promptly; Run may be called again
// after it returned; a Run whose Redis is unreachable still returns on
// cancel; no scheduler goroutine outlives Run. Not parallel, so that the
// goroutine count is ours.
func TestAttack14_runLifecycle(t *testing.T) {
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	before := schedGoroutines()
	s, err := periodic.New(rdb, periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "l", Type: "t", Every: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	waitCount(t, rdb, name, "l", 1, 30*time.Second)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	err2 := s.Run(ctx2)
	cancel2()
	if err2 == nil {
		t.Errorf("a second concurrent Run returned nil, want an error")
	}
	n, _ := rdb.XLen(context.Background(), name).Result()
	waitCount(t, rdb, name, "l", int(n)+1, 30*time.Second) // the first Run goes on
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
	// Run again, after the first returned.
	ctx3, cancel3 := context.WithCancel(context.Background())
	errc3 := make(chan error, 1)
	go func() { errc3 <- s.Run(ctx3) }()
	n, _ = rdb.XLen(context.Background(), name).Result()
	waitCount(t, rdb, name, "l", int(n)+1, 30*time.Second)
	cancel3()
	if err := <-errc3; err != nil {
		t.Errorf("second Run: %v", err)
	}
	checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"l": 1000}, map[string]int64{"l": 500})

	// An already-cancelled context: returns nil at once.
	dead, deadCancel := context.WithCancel(context.Background())
	deadCancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(dead) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run(cancelled ctx) = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run(cancelled ctx) did not return")
	}

	// Unreachable Redis: still returns on cancel.
	bad := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond})
	defer bad.Close()
	var logs atkBuf
	sb, err := periodic.New(bad, periodic.Config{Stream: name + "x", Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{{Name: "l", Type: "t", Every: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx4, cancel4 := context.WithCancel(context.Background())
	errc4 := make(chan error, 1)
	go func() { errc4 <- sb.Run(ctx4) }()
	poll.Until(t, 30*time.Second, poll.True("an error logged for the unreachable Redis", func() bool { return logs.String() != "" }))
	t0 := time.Now()
	cancel4()
	select {
	case err := <-errc4:
		if err != nil {
			t.Errorf("Run on unreachable Redis after cancel: %v", err)
		}
		if d := time.Since(t0); d > 6*time.Second {
			t.Errorf("Run took %v to return after cancel", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run on an unreachable Redis did not return within 15s of cancel")
	}
	if strings.Count(logs.String(), "\n") > 200 {
		t.Errorf("%d log lines in a few seconds of an unreachable Redis: not bounded", strings.Count(logs.String(), "\n"))
	}
	poll.Until(t, 10*time.Second, func() (bool, string) {
		n := schedGoroutines()
		return n <= before, fmt.Sprintf("%d periodic goroutines, %d before", n, before)
	})
}

// ---------- hostile data in the periodic keys ----------

// TestAttack14_hostileKeys writes data of the wrong type into the stream and
// the record hash: the scheduler must log, not crash, write nothing partial
// (no marker or record without its entry), and resume once the key is
// fixed; a schedule beside the broken one must not stop.
func TestAttack14_hostileKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("stream is a string", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Shared(t)
		name := atkStream(t, rdb)
		k := atkKeys(t, name)
		rdb.Set(ctx, name, "not a stream", 0)
		var logs atkBuf
		runSched(t, rdb, periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{{Name: "s", Type: "t", Every: time.Second}}})
		poll.Until(t, 30*time.Second, poll.True("two errors logged", func() bool { return strings.Count(logs.String(), "\n") >= 2 }))
		if m := markers(t, rdb, k); len(m) != 0 {
			t.Errorf("a failed XADD left markers %v", m)
		}
		if n, _ := rdb.HLen(ctx, k.Periodic+"last").Result(); n != 0 {
			t.Errorf("a failed XADD left a record")
		}
		rdb.Del(ctx, name)
		waitCount(t, rdb, name, "s", 2, 30*time.Second)
		checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"s": 1000}, nil)
	})
	t.Run("record hash is a string", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Shared(t)
		name := atkStream(t, rdb)
		k := atkKeys(t, name)
		rdb.Set(ctx, k.Periodic+"last", "garbage", 0)
		var logs atkBuf
		runSched(t, rdb, periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{{Name: "s", Type: "t", Every: time.Second}}})
		poll.Until(t, 30*time.Second, poll.True("two errors logged", func() bool { return strings.Count(logs.String(), "\n") >= 2 }))
		if n, _ := rdb.XLen(ctx, name).Result(); n != 0 {
			t.Errorf("%d entries added while the record could not be read or written", n)
		}
		if m := markers(t, rdb, k); len(m) != 0 {
			t.Errorf("markers %v left while the record is broken", m)
		}
		if _, err := periodic.Records(ctx, rdb, name); err == nil {
			t.Errorf("Records on a string record key: nil error")
		}
		rdb.Del(ctx, k.Periodic+"last")
		waitCount(t, rdb, name, "s", 2, 30*time.Second)
		checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"s": 1000}, nil)
	})
	t.Run("marker of the next ticks is a hash", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Shared(t)
		name := atkStream(t, rdb)
		k := atkKeys(t, name)
		now := redisNowMs(t, rdb)
		next := now - now%1000 + 1000
		for i := int64(0); i < 3; i++ {
			rdb.HSet(ctx, k.Periodic+"tick:s:"+strconv.FormatInt(next+i*1000, 10), "x", "y")
		}
		runSched(t, rdb, periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "s", Type: "t", Every: time.Second}}})
		waitCount(t, rdb, name, "s", 2, 30*time.Second)
		by := checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"s": 1000}, nil)
		for _, e := range by["s"] {
			if e.tick >= next && e.tick < next+3000 {
				t.Errorf("tick %d was enqueued though its marker existed", e.tick)
			}
		}
	})
	for _, v := range []string{"abc", "", "nan", "-nan", "1.5", "-1", "0x10", " 12"} {
		t.Run("record field "+strconv.Quote(v), func(t *testing.T) {
			t.Parallel()
			garbageRecord(t, v)
		})
	}
}

// TestAttack14_numericGarbageRecordWedges: a record field that Records (and
// `pelican schedules`) report as holding no time ("inf", "1e400", an integer
// past int64) stops its schedule for good, silently: every tick is refused
// as stale and nothing is logged. The docs say Records' LastTick is zero
// when the record "does not hold a time (written by something else)", and
// that a tick nobody enqueued is "missed and logged".
func TestAttack14_numericGarbageRecordWedges(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"1e400", "inf", "99999999999999999999"} {
		t.Run("record field "+strconv.Quote(v), func(t *testing.T) {
			t.Parallel()
			garbageRecord(t, v)
		})
	}
}

// garbageRecord writes v as schedule g's record and runs g beside a healthy
// schedule: the healthy one goes on, Records stays consistent, and g is not
// stopped by a record that holds no time.
func garbageRecord(t *testing.T, v string) {
	t.Helper()
	ctx := context.Background()
	{
		{
			rdb := redistest.Shared(t)
			name := atkStream(t, rdb)
			k := atkKeys(t, name)
			rdb.HSet(ctx, k.Periodic+"last", "g", v)
			var logs atkBuf
			runSched(t, rdb, periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{
				{Name: "g", Type: "t", Every: time.Second},
				{Name: "ok", Type: "t", Every: time.Second},
			}})
			// The healthy schedule beside the garbage goes on.
			waitCount(t, rdb, name, "ok", 4, 30*time.Second)
			recs, err := periodic.Records(ctx, rdb, name)
			if err != nil {
				t.Errorf("Records: %v", err)
			}
			for _, r := range recs {
				if r.Name == "ok" && (r.LastTick.IsZero() || r.JobID != periodic.JobID("ok", r.LastTick)) {
					t.Errorf("record of ok: %+v", r)
				}
				if r.LastTick.IsZero() != (r.JobID == "") {
					t.Errorf("record %+v: JobID and LastTick disagree", r)
				}
			}
			es := atkEntries(t, rdb, name)
			checkInvariants(t, es, map[string]int64{"g": 1000, "ok": 1000}, nil)
			cur, _ := rdb.HGet(ctx, k.Periodic+"last", "g").Result()
			t.Logf("garbage %q: schedule g enqueued %d jobs, ok %d; record now %q; logs %d lines", v, countSched(es, "g"), countSched(es, "ok"), cur, strings.Count(logs.String(), "\n"))
			if countSched(es, "g") == 0 {
				t.Errorf("a record field %q (Records: no time) stops schedule g for good; record %q; %d log lines", v, cur, strings.Count(logs.String(), "\n"))
			}
		}
	}
}

// TestAttack14_recordsGarbage: Records on fields that hold no time returns
// them with a zero LastTick and no JobID, and the good one intact.
func TestAttack14_recordsGarbage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	k := atkKeys(t, name)
	good := time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)
	rdb.HSet(ctx, k.Periodic+"last", "good", strconv.FormatInt(good.UnixMilli(), 10), "abc", "abc", "fl", "1.5", "nan", "nan", "huge", "99999999999999999999", "empty", "")
	recs, err := periodic.Records(ctx, rdb, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 6 || !sort.SliceIsSorted(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name }) {
		t.Fatalf("Records = %+v, want 6 sorted by name", recs)
	}
	for _, r := range recs {
		if r.Name == "good" {
			if !r.LastTick.Equal(good) || r.JobID != "good@2026-03-09T06:30:00.000Z" {
				t.Errorf("good: %+v", r)
			}
			continue
		}
		if !r.LastTick.IsZero() || r.JobID != "" {
			t.Errorf("%s: %+v, want a zero LastTick and no JobID", r.Name, r)
		}
	}
}

// ---------- missed ticks ----------

// TestAttack14_missedPolicies stops every scheduler for several ticks, then
// starts three at once: Skip enqueues nothing for the gap (no burst);
// RunOnce enqueues exactly one job for the gap, the latest tick due when
// they started.
func TestAttack14_missedPolicies(t *testing.T) {
	t.Parallel()
	for _, pol := range []periodic.Missed{periodic.Skip, periodic.RunOnce} {
		t.Run(pol.String(), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			name := atkStream(t, rdb)
			cfg := periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "m", Type: "t", Every: time.Second, Tolerance: 200 * time.Millisecond, Missed: pol}}}
			stop := runSched(t, rdb, cfg)
			waitCount(t, rdb, name, "m", 2, 30*time.Second)
			stop()
			es := atkEntries(t, rdb, name)
			lastBefore := es[len(es)-1].tick
			// every scheduler down for at least 3 whole ticks
			poll.Until(t, 30*time.Second, func() (bool, string) {
				now := redisNowMs(t, rdb)
				return now > lastBefore+4300, "waiting for missed ticks"
			})
			startMs := redisNowMs(t, rdb)
			var stops []func()
			for range 3 {
				c := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
				t.Cleanup(func() { c.Close() })
				stops = append(stops, runSched(t, c, cfg))
			}
			startedMs := redisNowMs(t, rdb)
			waitCount(t, rdb, name, "m", len(es)+2, 30*time.Second)
			for _, s := range stops {
				s()
			}
			all := atkEntries(t, rdb, name)
			tol := map[string]int64{}
			if pol == periodic.Skip {
				tol["m"] = 200
			}
			checkInvariants(t, all, map[string]int64{"m": 1000}, tol)
			var late []pjob
			for _, e := range all[len(es):] {
				if e.entryMs-e.tick > 200 {
					late = append(late, e)
				}
			}
			switch pol {
			case periodic.Skip:
				if len(late) != 0 {
					t.Errorf("Skip caught up: %d late jobs", len(late))
				}
			case periodic.RunOnce:
				if len(late) != 1 {
					for _, e := range all {
						t.Logf("entry %s tick %d late %d", e.entryID, e.tick, e.entryMs-e.tick)
					}
					t.Fatalf("RunOnce enqueued %d late jobs for the gap, want exactly 1", len(late))
				}
				c := late[0]
				// the latest tick due when they started: at least the one due at startMs
				if c.tick < startMs-startMs%1000-1000 || c.tick > startedMs {
					t.Errorf("catch-up tick %d is not the latest due at the start (%d..%d)", c.tick, startMs, startedMs)
				}
			}
		})
	}
}

// TestAttack14_runOnceNeverRan: a RunOnce schedule with no record has
// nothing to catch up, even with many schedulers starting at once.
func TestAttack14_runOnceNeverRan(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	cfg := periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "n", Type: "t", Every: 2 * time.Second, Tolerance: 300 * time.Millisecond, Missed: periodic.RunOnce}}}
	for range 3 {
		runSched(t, rdb, cfg)
	}
	waitCount(t, rdb, name, "n", 2, 30*time.Second)
	es := atkEntries(t, rdb, name)
	if d := es[0].entryMs - es[0].tick; d > 300 {
		t.Errorf("the first job is %d ms late: a catch-up for a schedule that never ran", d)
	}
	checkInvariants(t, es, map[string]int64{"n": 2000}, nil)
}

// ---------- Redis faults ----------

// TestAttack14_redisKillRestartFreeze runs three schedulers against a
// private Redis (AOF always) that is SIGKILLed and restarted, then frozen
// (SIGSTOP) past a tick's tolerance and resumed: no tick twice, none early,
// none past its tolerance (Skip), and the schedulers go on after each fault.
func TestAttack14_redisKillRestartFreeze(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{AOF: "always"})
	rdb := srv.Client(t)
	name := "{atk14}"
	k := atkKeys(t, name)
	secret := "SECRET-" + strconv.FormatUint(rand.Uint64(), 16)
	var logs atkBuf
	cfg := periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{{Name: "r", Type: "t", Every: time.Second, Tolerance: 400 * time.Millisecond, Payload: []byte(`"` + secret + `"`)}}}
	var stops []func()
	for range 3 {
		stops = append(stops, runSched(t, srv.Client(t), cfg))
	}
	waitCount(t, rdb, name, "r", 3, 30*time.Second)
	srv.Kill9()
	down := time.Now()
	for time.Since(down) < 2500*time.Millisecond { // Redis stays down over two ticks (the scenario)
		time.Sleep(100 * time.Millisecond)
	}
	srv.Restart()
	n, _ := rdb.XLen(context.Background(), name).Result()
	waitCount(t, rdb, name, "r", int(n)+3, 60*time.Second)
	srv.Stop()
	frozen := time.Now()
	for time.Since(frozen) < 2*time.Second { // frozen past the tolerance (the scenario)
		time.Sleep(100 * time.Millisecond)
	}
	srv.Cont()
	n, _ = rdb.XLen(context.Background(), name).Result()
	waitCount(t, rdb, name, "r", int(n)+3, 60*time.Second)
	for _, s := range stops {
		s()
	}
	checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"r": 1000}, map[string]int64{"r": 400})
	for _, m := range markers(t, rdb, k) {
		if ttl, _ := rdb.PTTL(context.Background(), m).Result(); ttl <= 0 {
			t.Errorf("marker %s has no TTL after the faults (%v)", m, ttl)
		}
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the payload reached the logs")
	}
	if !strings.Contains(logs.String(), "level=") {
		t.Errorf("no error logged across a Redis kill")
	}
}

// TestAttack14_redisFullDuringTicks: a scheduler keeps ticking against a
// Redis filled up (noeviction): nothing is written while full (no entry,
// marker or record), nothing leaks the payload into the logs, and ticks
// resume once memory is freed.
func TestAttack14_redisFullDuringTicks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}})
	rdb := srv.Client(t)
	ctx := context.Background()
	name := "{atk14full}"
	k := atkKeys(t, name)
	pad := strings.Repeat("x", 1000)
	n := 0
	for ; ; n++ {
		if n > 100_000 {
			t.Fatal("Redis never filled")
		}
		if err := rdb.Set(ctx, "fill:"+strconv.Itoa(n), pad, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
	}
	secret := "SECRET-" + strconv.FormatUint(rand.Uint64(), 16)
	var logs atkBuf
	runSched(t, srv.Client(t), periodic.Config{Stream: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Schedules: []periodic.Schedule{{Name: "f", Type: "t", Every: time.Second, Payload: []byte(`"` + secret + `"`)}}})
	poll.Until(t, 30*time.Second, func() (bool, string) {
		// keep it full: top up whatever a refused command freed
		for i := 0; i < 50; i++ {
			if rdb.Set(ctx, "fill:"+strconv.Itoa(n), pad, 0).Err() != nil {
				break
			}
			n++
		}
		return strings.Contains(logs.String(), "OOM"), "an OOM logged: " + logs.String()
	})
	xl, _ := rdb.XLen(ctx, name).Result()
	ms := markers(t, rdb, k)
	recs, _ := rdb.HGetAll(ctx, k.Periodic+"last").Result()
	es := atkEntries(t, rdb, name)
	if len(ms) > int(xl) || len(recs) > 0 && xl == 0 {
		t.Errorf("state written without its entry while full: %d entries, markers %v, records %v", xl, ms, recs)
	}
	for _, m := range ms { // each marker names an entry that exists
		v, _ := rdb.Get(ctx, m).Result()
		found := false
		for _, e := range es {
			found = found || e.entryID == v
		}
		if !found {
			t.Errorf("marker %s holds %q, no such entry", m, v)
		}
	}
	// free memory
	iter := rdb.Scan(ctx, 0, "fill:*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 500 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
	waitCount(t, rdb, name, "f", int(xl)+2, 30*time.Second)
	checkInvariants(t, atkEntries(t, rdb, name), map[string]int64{"f": 1000}, map[string]int64{"f": 500})
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the payload reached the logs")
	}
}

// ---------- processes ----------

func childEnv(name string, every, tol time.Duration, missed string) []string {
	return []string{"ATK14_REDIS=" + redistest.Addr(), "ATK14_STREAM=" + name,
		"ATK14_EVERY_MS=" + strconv.FormatInt(every.Milliseconds(), 10),
		"ATK14_TOL_MS=" + strconv.FormatInt(tol.Milliseconds(), 10), "ATK14_MISSED=" + missed}
}

// TestAttack14_sigstopNoStaleTick SIGSTOPs scheduler processes at random
// points (often just before or at their tick), holds them past the tick's
// tolerance and resumes them, while a third keeps running: no tick is
// enqueued twice, none early, and none after its tolerance (a stale tick
// from a resumed scheduler), for Skip and for RunOnce.
func TestAttack14_sigstopNoStaleTick(t *testing.T) {
	t.Parallel()
	for _, missed := range []string{"skip", "run-once"} {
		t.Run(missed, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Shared(t)
			name := atkStream(t, rdb)
			env := childEnv(name, time.Second, 300*time.Millisecond, missed)
			kids := []*atkChild{startAtkChild(t, env...), startAtkChild(t, env...)}
			waitCount(t, rdb, name, "hb", 2, 60*time.Second)
			for round := 0; round < 4; round++ {
				k := kids[rand.IntN(len(kids))]
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond) // a random point in the second
				_ = k.cmd.Process.Signal(syscall.SIGSTOP)
				held := time.Now()
				for time.Since(held) < 1500*time.Millisecond {
					time.Sleep(50 * time.Millisecond)
				}
				_ = k.cmd.Process.Signal(syscall.SIGCONT)
			}
			n, _ := rdb.XLen(context.Background(), name).Result()
			waitCount(t, rdb, name, "hb", int(n)+1, 60*time.Second)
			for _, k := range kids {
				k.term(t)
			}
			es := atkEntries(t, rdb, name)
			if missed == "skip" {
				checkInvariants(t, es, map[string]int64{"hb": 1000}, map[string]int64{"hb": 300})
				return
			}
			checkInvariants(t, es, map[string]int64{"hb": 1000}, nil)
			for i, e := range es {
				late := e.entryMs - e.tick
				if late <= 300 {
					continue
				}
				// a catch-up: only for a tick no one enqueued, and the latest due
				if late >= 1000 {
					t.Errorf("job %s enqueued %d ms late: not the latest tick due then", e.job.ID, late)
				}
				if i > 0 && es[i-1].tick == e.tick-1000 {
					t.Logf("catch-up %s right after its previous tick (the other scheduler was stalled too?)", e.job.ID)
				}
			}
		})
	}
}

// TestAttack14_processesSIGKILL runs four scheduler processes and SIGKILLs
// one at a random point every round, starting a new one: every tick once,
// none early, none past its tolerance; ticks missing while three were
// running are logged.
func TestAttack14_processesSIGKILL(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	env := childEnv(name, time.Second, 1000*time.Millisecond, "skip")
	var kids []*atkChild
	for range 4 {
		kids = append(kids, startAtkChild(t, env...))
	}
	waitCount(t, rdb, name, "hb", 2, 60*time.Second)
	for round := 0; round < 6; round++ {
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond) // a random point
		i := rand.IntN(len(kids))
		kids[i].kill()
		kids[i] = startAtkChild(t, env...)
	}
	n, _ := rdb.XLen(context.Background(), name).Result()
	waitCount(t, rdb, name, "hb", int(n)+2, 60*time.Second)
	for _, k := range kids {
		k.term(t)
	}
	es := atkEntries(t, rdb, name)
	checkInvariants(t, es, map[string]int64{"hb": 1000}, map[string]int64{"hb": 1000})
	gaps := 0
	for i := 1; i < len(es); i++ {
		gaps += int((es[i].tick-es[i-1].tick)/1000) - 1
	}
	t.Logf("%d jobs, %d ticks missing between the first and the last", len(es), gaps)
}

// TestAttack14_rollingDeployRedefinition runs two definitions of one name
// side by side (Every 1 s with payload "old", Every 2 s with payload "new"):
// a tick both have is enqueued once, the odd seconds by the old definition's
// scheduler only, and ticks never go backwards.
func TestAttack14_rollingDeployRedefinition(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := atkStream(t, rdb)
	stopOld := runSched(t, rdb, periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "d", Type: "t", Every: time.Second, Payload: []byte(`"old"`)}}})
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { c.Close() })
	stopNew := runSched(t, c, periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "d", Type: "t", Every: 2 * time.Second, Payload: []byte(`"new"`)}}})
	waitCount(t, rdb, name, "d", 6, 60*time.Second)
	stopOld()
	stopNew()
	es := atkEntries(t, rdb, name)
	checkInvariants(t, es, map[string]int64{"d": 1000}, map[string]int64{"d": 1000})
	for _, e := range es {
		if p := string(e.job.Payload); e.tick%2000 != 0 && p != `"old"` {
			t.Errorf("odd tick %s enqueued with payload %s, only the old definition has it", e.job.ID, p)
		}
	}
}

// TestAttack14_streamNames: a stream with its own hash tag and one without
// both get their jobs, and the record lands where stream.KeysFor says.
func TestAttack14_streamNames(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	base := redistest.Name(t)
	for _, name := range []string{"{" + base + "}:jobs", base + "-plain"} {
		k := atkKeys(t, name)
		t.Cleanup(func() {
			redistest.DeleteKeys(rdb, name)
			redistest.DeleteKeys(rdb, k.Periodic+"*")
		})
		runSched(t, rdb, periodic.Config{Stream: name, Schedules: []periodic.Schedule{{Name: "s", Type: "t", Every: time.Second}}})
		waitCount(t, rdb, name, "s", 1, 30*time.Second)
		if v, err := rdb.HGet(context.Background(), k.Periodic+"last", "s").Result(); err != nil {
			t.Errorf("stream %s: no record at %s: %v", name, k.Periodic+"last", err)
		} else if _, err := strconv.ParseInt(v, 10, 64); err != nil {
			t.Errorf("record %q is not Unix ms", v)
		}
		recs, err := periodic.Records(context.Background(), rdb, name)
		if err != nil || len(recs) != 1 || recs[0].Name != "s" || recs[0].LastTick.IsZero() {
			t.Errorf("Records(%s) = %+v, %v", name, recs, err)
		}
	}
}
