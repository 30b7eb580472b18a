package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// latencies records enqueue-to-handler latencies. It is safe for
// concurrent use.
type latencies struct {
	d []time.Duration
	i atomic.Int64
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, n)} }

// record records the latency of the job whose payload is p, sent at sent
// (Unix ns, as text), unless it is the warm-up job 0.
func (l *latencies) record(p, sent string) { recordLatency(l, p, sent) }

func recordLatency[T string | []byte](l *latencies, p T, sent string) {
	now := time.Now()
	if seq, ok := seqOf(p); !ok || seq == 0 {
		return
	}
	ns, err := strconv.ParseInt(sent, 10, 64)
	if err != nil {
		return // counted as missing by percentiles' caller through the job set
	}
	if i := l.i.Add(1) - 1; int(i) < len(l.d) {
		l.d[i] = now.Sub(time.Unix(0, ns))
	}
}

// percentiles returns the p50 and p99 of the recorded latencies.
func (l *latencies) percentiles() (p50, p99 time.Duration) {
	s := slices.Clone(l.d[:min(int(l.i.Load()), len(l.d))])
	if len(s) == 0 {
		return 0, 0
	}
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}

// latencyJobs is the number of jobs of a latency run.
func (b *bench) latencyJobs() int { return max(1, int(float64(b.rate)*b.latencyFor.Seconds())) }

// paced sends job 0 and waits for its acknowledgement (the consumer is
// then reading), then sends jobs 1..total at the bench's rate, one call to
// send each, and measures until all are acknowledged.
func (b *bench) paced(ctx context.Context, what string, total int, send func(seq int), acked func() int64) result {
	send(0)
	b.waitFor(what+" (warm-up job)", func() bool { return acked() >= 1 }, func() string { return "not acknowledged" })
	m := b.startMeter(ctx)
	interval := time.Second / time.Duration(b.rate)
	start := time.Now()
	for i := 1; i <= total; i++ {
		if wait := time.Until(start.Add(time.Duration(i-1) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		send(i)
	}
	b.waitFor(what, func() bool { return acked() >= int64(total+1) }, func() string {
		return fmt.Sprintf("%d of %d acknowledged", acked()-1, total)
	})
	return m.stop(ctx, total)
}
