package periodic

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
)

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	ok := Schedule{Name: "a", Every: time.Second, Type: "t"}
	with := func(f func(*Schedule)) Config {
		s := ok
		f(&s)
		return Config{Stream: "q", Schedules: []Schedule{s}}
	}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"every", with(func(*Schedule) {}), ""},
		{"cron", with(func(s *Schedule) { s.Every, s.Cron = 0, "30 2 * * *" }), ""},
		{"cron seconds", with(func(s *Schedule) { s.Every, s.Cron = 0, "*/5 * * * * *" }), ""},
		{"cron descriptor", with(func(s *Schedule) { s.Every, s.Cron = 0, "@daily" }), ""},
		{"cron location", with(func(s *Schedule) { s.Every, s.Cron, s.Location = 0, "30 2 * * *", ny }), ""},
		{"cron tz", with(func(s *Schedule) { s.Every, s.Cron = 0, "CRON_TZ=America/New_York 30 2 * * *" }), ""},
		{"no stream", Config{Schedules: []Schedule{ok}}, "Config.Stream"},
		{"bad stream", Config{Stream: "a}b", Schedules: []Schedule{ok}}, "Config.Stream"},
		{"no schedules", Config{Stream: "q"}, "Config.Schedules is empty"},
		{"twice", Config{Stream: "q", Schedules: []Schedule{ok, ok}}, `Schedules[1]: Schedule.Name "a" is used twice`},
		{"empty name", with(func(s *Schedule) { s.Name = "" }), "Schedule.Name is required"},
		{"bad name", with(func(s *Schedule) { s.Name = "a:b" }), "Schedule.Name (\"a:b\") may hold only"},
		{"brace name", with(func(s *Schedule) { s.Name = "a{b}" }), "Schedule.Name"},
		{"long name", with(func(s *Schedule) { s.Name = strings.Repeat("n", MaxNameLen+1) }), "longer than 100 bytes"},
		{"no type", with(func(s *Schedule) { s.Type = "" }), "Type is required"},
		{"no timing", with(func(s *Schedule) { s.Every = 0 }), "Cron or Every is required"},
		{"both", with(func(s *Schedule) { s.Cron = "* * * * *" }), "Cron and Every are both set"},
		{"bad cron", with(func(s *Schedule) { s.Every, s.Cron = 0, "61 * * * *" }), "Cron (\"61 * * * *\") does not parse"},
		{"cron words", with(func(s *Schedule) { s.Every, s.Cron = 0, "every day" }), "does not parse"},
		{"cron every", with(func(s *Schedule) { s.Every, s.Cron = 0, "@every 5m" }), "use Schedule.Every"},
		{"cron never", with(func(s *Schedule) { s.Every, s.Cron = 0, "0 0 30 2 *" }), "never matches"},
		{"cron bad tz", with(func(s *Schedule) { s.Every, s.Cron = 0, "CRON_TZ=Nowhere/Land 0 * * * *" }), "does not parse"},
		{"tz twice", with(func(s *Schedule) { s.Every, s.Cron, s.Location = 0, "CRON_TZ=UTC 0 * * * *", ny }), "Location is set and Cron"},
		{"every location", with(func(s *Schedule) { s.Location = ny }), "Location is set with Every"},
		{"every short", with(func(s *Schedule) { s.Every = 999 * time.Millisecond }), "Every (999ms) must be at least 1s"},
		{"every negative", with(func(s *Schedule) { s.Every = -time.Hour }), "Every (-1h0m0s) must be at least 1s"},
		{"every fraction", with(func(s *Schedule) { s.Every = time.Second + time.Microsecond }), "whole number of milliseconds"},
		{"attempts", with(func(s *Schedule) { s.MaxAttempts = -1 }), "MaxAttempts (-1)"},
		{"tolerance", with(func(s *Schedule) { s.Tolerance = -1 }), "Tolerance (-1ns)"},
		{"tolerance small", with(func(s *Schedule) { s.Tolerance = time.Microsecond }), "Tolerance (1µs) must be 0 or at least 1ms"},
		{"headers", with(func(s *Schedule) {
			s.Headers = map[string]string{}
			for i := range MaxHeaders + 1 {
				s.Headers[strconv.Itoa(i)] = "v"
			}
		}), "Headers has 1001 entries; at most 1000"},
		{"missed", with(func(s *Schedule) { s.Missed = 7 }), "Missed (7) must be Skip or RunOnce"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			// New fails the same way, before it could use the client.
			if _, nerr := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), tt.cfg); nerr == nil || nerr.Error() != err.Error() {
				t.Fatalf("New() = %v, want %v", nerr, err)
			}
		})
	}
}

func TestJobID(t *testing.T) {
	t.Parallel()
	ny, _ := time.LoadLocation("America/New_York")
	got := JobID("nightly-report", time.Date(2026, 3, 9, 2, 30, 0, 0, ny))
	if want := "nightly-report@2026-03-09T06:30:00.000Z"; got != want {
		t.Fatalf("JobID = %q, want %q", got, want)
	}
	if got := JobID("x", time.UnixMilli(1500)); got != "x@1970-01-01T00:00:01.500Z" {
		t.Fatalf("JobID with ms = %q", got)
	}
}

func TestEntry_prevNext(t *testing.T) {
	t.Parallel()
	must := func(s Schedule) *entry {
		s.Name, s.Type = "n", "t"
		e, err := compile(s)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ny, _ := time.LoadLocation("America/New_York")
	at := time.Date(2026, 3, 9, 12, 0, 0, 500, time.UTC)
	for _, tt := range []struct {
		name       string
		e          *entry
		t          time.Time
		prev, next time.Time
	}{
		{"every on a tick", must(Schedule{Every: 90 * time.Second}), time.UnixMilli(180_000), time.UnixMilli(180_000), time.UnixMilli(270_000)},
		{"every between", must(Schedule{Every: 90 * time.Second}), time.UnixMilli(180_001), time.UnixMilli(180_000), time.UnixMilli(270_000)},
		{"hourly", must(Schedule{Cron: "0 * * * *"}), at, at.Truncate(time.Hour), at.Truncate(time.Hour).Add(time.Hour)},
		{"hourly on a tick", must(Schedule{Cron: "0 * * * *"}), at.Truncate(time.Hour), at.Truncate(time.Hour), at.Truncate(time.Hour).Add(time.Hour)},
		{"seconds", must(Schedule{Cron: "*/5 * * * * *"}), at.Add(7 * time.Second), at.Truncate(time.Minute).Add(5 * time.Second), at.Truncate(time.Minute).Add(10 * time.Second)},
		{"yearly", must(Schedule{Cron: "@yearly"}), at, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"spring forward", must(Schedule{Cron: "30 2 * * *", Location: ny}), time.Date(2026, 3, 8, 12, 0, 0, 0, ny),
			time.Date(2026, 3, 7, 2, 30, 0, 0, ny), time.Date(2026, 3, 9, 2, 30, 0, 0, ny)},
		{"fall back, between", must(Schedule{Cron: "30 1 * * *", Location: ny}), time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC),
			time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := tt.e.prev(tt.t)
			if !ok || !p.Equal(tt.prev) {
				t.Errorf("prev(%v) = %v %v, want %v", tt.t, p, ok, tt.prev)
			}
			if n := tt.e.next(tt.t); !n.Equal(tt.next) {
				t.Errorf("next(%v) = %v, want %v", tt.t, n, tt.next)
			}
		})
	}
}

func TestEntry_tolerance(t *testing.T) {
	t.Parallel()
	e, _ := compile(Schedule{Name: "n", Type: "t", Every: time.Second})
	if got := e.tolerance(time.UnixMilli(0)); got != 500*time.Millisecond {
		t.Errorf("default tolerance of Every 1s = %v, want 500ms", got)
	}
	e, _ = compile(Schedule{Name: "n", Type: "t", Cron: "@daily"})
	if got := e.tolerance(time.UnixMilli(0)); got != DefaultTolerance {
		t.Errorf("default tolerance of @daily = %v, want %v", got, DefaultTolerance)
	}
	e, _ = compile(Schedule{Name: "n", Type: "t", Every: time.Second, Tolerance: time.Hour})
	if got := e.tolerance(time.UnixMilli(0)); got != time.Second {
		t.Errorf("tolerance 1h of Every 1s = %v, want 1s (the time to the next tick)", got)
	}
}

// TestScheduler_keysShareSlot checks that the tick script's keys hash to the
// stream's cluster slot, with and without a hash tag in the stream's name.
func TestScheduler_keysShareSlot(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"orders", "{shop}:orders", "a.b-c"} {
		s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Config{Stream: name,
			Schedules: []Schedule{{Name: "n.1_x-y", Type: "t", Every: time.Second}}})
		if err != nil {
			t.Fatal(err)
		}
		want := keyslot.Of(name)
		for _, k := range []string{s.keys.Periodic + "last", s.markerKey("n.1_x-y", 1796163756000)} {
			if got := keyslot.Of(k); got != want {
				t.Errorf("key %q is in slot %d, the stream %q in %d", k, got, name, want)
			}
		}
	}
}
