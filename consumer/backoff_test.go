package consumer_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

func TestBackoff_Raw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		b       consumer.Backoff
		attempt int
		want    time.Duration
	}{
		{"defaults first", consumer.Backoff{}, 0, time.Second},
		{"defaults doubled", consumer.Backoff{}, 3, 8 * time.Second},
		{"defaults doubled further", consumer.Backoff{}, 10, 1024 * time.Second},
		{"defaults capped at an hour", consumer.Backoff{}, 12, time.Hour},
		{"negative attempt", consumer.Backoff{Base: time.Second}, -5, time.Second},
		{"base", consumer.Backoff{Base: 3 * time.Millisecond, Cap: time.Hour}, 0, 3 * time.Millisecond},
		{"doubling", consumer.Backoff{Base: 3 * time.Millisecond, Cap: time.Hour}, 4, 48 * time.Millisecond},
		{"exactly cap", consumer.Backoff{Base: time.Second, Cap: 8 * time.Second}, 3, 8 * time.Second},
		{"just over cap", consumer.Backoff{Base: time.Second, Cap: 8*time.Second - 1}, 3, 8*time.Second - 1},
		{"base over cap", consumer.Backoff{Base: time.Hour, Cap: time.Minute}, 0, time.Minute},
		{"attempt 61", consumer.Backoff{Base: 1, Cap: math.MaxInt64}, 61, 1 << 61},
		{"attempt 62 no overflow", consumer.Backoff{Base: 1, Cap: math.MaxInt64}, 62, math.MaxInt64},
		{"attempt 63 no overflow", consumer.Backoff{Base: time.Second, Cap: time.Hour}, 63, time.Hour},
		{"attempt 64 no overflow", consumer.Backoff{Base: time.Second, Cap: time.Hour}, 64, time.Hour},
		{"huge attempt", consumer.Backoff{Base: time.Second, Cap: time.Hour}, math.MaxInt, time.Hour},
		{"overflowing shift", consumer.Backoff{Base: time.Hour, Cap: math.MaxInt64}, 40, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.b.Raw(tc.attempt); got != tc.want {
				t.Errorf("Raw(%d) = %v, want %v", tc.attempt, got, tc.want)
			}
		})
	}
}

// jobN returns the i-th job of a test at attempt.
func jobN(i, attempt int) *stream.Job {
	return &stream.Job{ID: fmt.Sprint("job-", i), EntryID: fmt.Sprint(1700000000000+i, "-0"), Attempt: attempt}
}

func TestBackoff_Delay(t *testing.T) {
	t.Parallel()

	// A raw delay of 3ns has few enough values that every one of them,
	// bounds included, shows up over many jobs: the bounds are exact.
	t.Run("exact bounds", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			jitter consumer.Jitter
			want   []time.Duration // every possible value
		}{
			{consumer.JitterFull, []time.Duration{0, 1, 2, 3}},
			{consumer.JitterEqual, []time.Duration{1, 2, 3}},
			{consumer.JitterNone, []time.Duration{3}},
		} {
			b := consumer.Backoff{Base: 3, Cap: 3, Jitter: tc.jitter}
			seen := map[time.Duration]int{}
			for i := range 2000 {
				seen[b.Delay(jobN(i, 0))]++
			}
			if len(seen) != len(tc.want) {
				t.Errorf("jitter %d: values %v, want exactly %v", tc.jitter, seen, tc.want)
			}
			for _, w := range tc.want {
				if seen[w] < 2000/len(tc.want)/2 {
					t.Errorf("jitter %d: value %v drawn %d times of 2000 (seen %v): not spread", tc.jitter, w, seen[w], seen)
				}
			}
		}
	})

	t.Run("within bounds", func(t *testing.T) {
		t.Parallel()
		for _, b := range []consumer.Backoff{
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: consumer.JitterFull},
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: consumer.JitterEqual},
			{Base: 7, Cap: 1001, Jitter: consumer.JitterEqual}, // odd raw delays
			{Base: 100 * time.Millisecond, Cap: time.Minute, Jitter: consumer.JitterNone},
			{}, // defaults: equal jitter
		} {
			for attempt := range 20 {
				raw := b.Raw(attempt)
				lo, hi := raw/2, raw
				switch b.Jitter {
				case consumer.JitterFull:
					lo = 0
				case consumer.JitterNone:
					lo = raw
				}
				for i := range 200 {
					if d := b.Delay(jobN(i, attempt)); d < lo || d > hi {
						t.Fatalf("%+v Delay(attempt %d) = %v, want within [%v, %v]", b, attempt, d, lo, hi)
					}
				}
			}
		}
	})

	t.Run("largest delays", func(t *testing.T) {
		t.Parallel()
		for _, j := range []consumer.Jitter{consumer.JitterFull, consumer.JitterEqual, consumer.JitterNone} {
			b := consumer.Backoff{Base: time.Hour, Cap: math.MaxInt64, Jitter: j}
			for i := range 100 {
				if d := b.Delay(jobN(i, 1000)); d < 0 || (j == consumer.JitterEqual && d < math.MaxInt64/2) {
					t.Fatalf("jitter %d: Delay = %v", j, d)
				}
			}
		}
	})

	// The delay of one job's attempt is the same wherever it is computed;
	// another attempt, entry or job draws another.
	t.Run("same job, same delay", func(t *testing.T) {
		t.Parallel()
		b := consumer.Backoff{Jitter: consumer.JitterFull}
		differ := 0
		for attempt := range 10 {
			d1, d2 := b.Delay(jobN(1, attempt)), b.Delay(jobN(1, attempt))
			if d1 != d2 {
				t.Fatalf("attempt %d: %v then %v for the same job", attempt, d1, d2)
			}
			if d1 != b.Delay(jobN(2, attempt)) {
				differ++
			}
		}
		if differ < 8 {
			t.Errorf("two jobs drew the same delay at %d of 10 attempts", 10-differ)
		}
	})
}

func TestBackoff_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		b    consumer.Backoff
		want string
	}{
		{consumer.Backoff{}, ""},
		{consumer.Backoff{Base: time.Minute}, ""},
		{consumer.Backoff{Base: -1}, "Backoff.Base"},
		{consumer.Backoff{Cap: -1}, "Backoff.Cap"},
		{consumer.Backoff{Jitter: 9}, "Backoff.Jitter"},
		{consumer.Backoff{Base: 2 * time.Hour}, "Backoff.Base (2h0m0s) must not exceed Backoff.Cap (1h0m0s)"},
	} {
		err := tc.b.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Validate() = %v, want naming %q", tc.b, err, tc.want)
		}
	}
	// In a Config, the field is named from the Config.
	if err := (consumer.Config{Stream: "s", Group: "g", Backoff: consumer.Backoff{Cap: -1}}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "Config.Backoff.Cap") {
		t.Errorf("Config.Validate() = %v, want it to name Config.Backoff.Cap", err)
	}
}
