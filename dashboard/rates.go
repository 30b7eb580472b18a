package dashboard

import (
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/internal/queuestats"
)

// The dashboard samples each queue's counters itself, whenever a page
// reads the queue (and at most once per sampleEvery), so that the overview
// can chart enqueue and completion rates without Prometheus. The counters
// are exact totals kept by Redis (entries added to the stream; entries a
// group read and no longer holds pending), so the rate between two samples
// is exact however far apart they are; only the resolution depends on how
// often someone looks.
const (
	sampleEvery = 5 * time.Second
	sampleKeep  = 60                                  // samples per queue
	chartSpan   = 5 * time.Minute                     // what the charts show
	chartBars   = int(chartSpan / (10 * time.Second)) // one bar per 10 s
)

type sample struct {
	at      time.Time // Redis time
	added   int64     // -1 unknown
	settled int64     // -1 unknown
}

type rates struct {
	mu sync.Mutex
	by map[string][]sample
}

func newRates() *rates { return &rates{by: map[string][]sample{}} }

// record adds a sample of q taken at now, unless the last is recent.
func (r *rates) record(q queuestats.Queue, now time.Time) {
	if q.Err != nil {
		return
	}
	s := sample{at: now, added: q.Added, settled: -1}
	for _, g := range q.Groups {
		if n := g.Settled(); n >= 0 {
			s.settled = max(s.settled, 0) + n
		} else {
			s.settled = -1
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ss := r.by[q.Stream]
	if n := len(ss); n > 0 && now.Sub(ss[n-1].at) < sampleEvery {
		return
	}
	ss = append(ss, s)
	if len(ss) > sampleKeep {
		ss = ss[len(ss)-sampleKeep:]
	}
	r.by[q.Stream] = ss
}

// chart is a small bar chart of a rate, drawn as SVG by the template.
type chart struct {
	Label string
	Bars  []bar
	Last  float64 // the latest rate, per second
	Max   float64
	Known bool
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

const chartW, chartH = 120.0, 24.0

// charts returns the added/s and settled/s charts of stream over the last
// chartSpan before now.
func (r *rates) charts(stream string, now time.Time) (added, settled chart) {
	r.mu.Lock()
	ss := append([]sample(nil), r.by[stream]...)
	r.mu.Unlock()
	return build("enqueued/s", ss, now, func(s sample) int64 { return s.added }),
		build("completed/s", ss, now, func(s sample) int64 { return s.settled })
}

func build(label string, ss []sample, now time.Time, val func(sample) int64) chart {
	c := chart{Label: label}
	type span struct {
		from, to time.Time
		rate     float64
	}
	var spans []span
	for i := 1; i < len(ss); i++ {
		a, b := val(ss[i-1]), val(ss[i])
		dt := ss[i].at.Sub(ss[i-1].at).Seconds()
		if a < 0 || b < 0 || dt <= 0 || b < a {
			continue // unknown, or a counter reset (stream recreated)
		}
		spans = append(spans, span{ss[i-1].at, ss[i].at, float64(b-a) / dt})
	}
	if len(spans) == 0 {
		return c
	}
	c.Known = true
	c.Last = spans[len(spans)-1].rate
	// One bar per slot of the chart: the rate of the span covering its end.
	rates := make([]float64, chartBars)
	has := make([]bool, chartBars)
	slot := chartSpan / time.Duration(chartBars)
	start := now.Add(-chartSpan)
	for i := range chartBars {
		end := start.Add(time.Duration(i+1) * slot)
		for _, s := range spans {
			if !s.to.Before(end.Add(-slot)) && !s.from.After(end) {
				rates[i], has[i] = s.rate, true
			}
		}
		c.Max = max(c.Max, rates[i])
	}
	w := chartW / float64(chartBars)
	for i := range chartBars {
		if !has[i] {
			continue
		}
		h := 1.0
		if c.Max > 0 {
			h = max(1, rates[i]/c.Max*chartH)
		}
		c.Bars = append(c.Bars, bar{X: float64(i) * w, Y: chartH - h, W: w - 0.5, H: h,
			Title: fmtRate(rates[i])})
	}
	return c
}

func fmtRate(r float64) string {
	switch {
	case r >= 100:
		return fmtInt(int64(r+0.5)) + "/s"
	case r >= 10:
		return trimFloat(r, 1) + "/s"
	default:
		return trimFloat(r, 2) + "/s"
	}
}
