package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/lockx"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [Config] and [CollectorConfig].
const (
	// DefaultNamespace starts every metric name.
	DefaultNamespace = "pelican"
	// DefaultMaxTypes bounds the distinct values of the type label.
	DefaultMaxTypes = 100
	// OtherType is the type label of jobs whose type came after
	// Config.MaxTypes others.
	OtherType = "other"
)

// DefaultBuckets are the buckets of the handler duration histogram, in
// seconds: 1 ms to 5 min.
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// DefaultLatencyBuckets are the buckets of the wait and latency histograms,
// in seconds: 1 ms to 6 h (retries can take hours).
var DefaultLatencyBuckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 21600}

// Outcome label values of pelican_jobs_processed_total: the
// [consumer.Kind] of the consumer's decision.
const (
	// OutcomeAck: the chain returned nil; the job is acknowledged.
	OutcomeAck = string(consumer.KindAck)
	// OutcomeRetry: the job is scheduled for a later attempt.
	OutcomeRetry = string(consumer.KindRetry)
	// OutcomeSnooze: the job is rescheduled without counting an attempt.
	OutcomeSnooze = string(consumer.KindSnooze)
	// OutcomeDeadLetter: the job is dead-lettered.
	OutcomeDeadLetter = string(consumer.KindDead)
	// OutcomeAbandoned: the consumer took the job back (shutdown past its
	// drain deadline, or lease lost); it stays pending for another consumer.
	OutcomeAbandoned = string(consumer.KindAbandoned)
	// OutcomeCancelled: an operator cancelled the job (control.Cancel).
	OutcomeCancelled = string(consumer.KindCancelled)
)

// Config configures [New].
type Config struct {
	// Buckets are the buckets of pelican_job_duration_seconds. Defaults to
	// [DefaultBuckets].
	Buckets []float64
	// LatencyBuckets are the buckets of pelican_job_wait_seconds and
	// pelican_job_latency_seconds. Defaults to [DefaultLatencyBuckets].
	LatencyBuckets []float64
	// MaxTypes bounds the distinct values of the type label (job types come
	// from the stream, which any producer writes): jobs of further types are
	// labelled [OtherType]. Defaults to [DefaultMaxTypes].
	MaxTypes int
	// Namespace starts every metric name. Defaults to [DefaultNamespace].
	Namespace string
}

// Validate reports the first field of cfg that is out of range, named.
func (cfg Config) Validate() error {
	if cfg.MaxTypes < 0 {
		return fmt.Errorf("metrics: Config.MaxTypes (%d) must not be negative", cfg.MaxTypes)
	}
	return nil
}

// Metrics holds the job metrics of one process, registered by [New]. It is
// safe for concurrent use; one Metrics serves any number of consumers and
// streams.
type Metrics struct {
	cfg Config

	processed     *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	wait          *prometheus.HistogramVec
	latency       *prometheus.HistogramVec
	inFlight      *prometheus.GaugeVec
	retries       *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	lockConflicts prometheus.Counter
	locksLost     *prometheus.CounterVec
	idemHits      *prometheus.CounterVec

	cache sync.Map // seriesKey → *series
	mu    sync.Mutex
	types map[string]struct{} // the type label values given out
}

type seriesKey struct{ stream, typ string }

// series holds the children of one (stream, type), resolved once.
type series struct {
	stream, typ                             string
	ack, retry, snooze, dead, aband, cancel prometheus.Counter
	retries, idemHits, locksLost            prometheus.Counter
	inFlight                                prometheus.Gauge
	duration, wait, latency                 prometheus.Observer
}

// New returns a Metrics whose collectors are registered with reg. It panics
// if registering fails (a second Metrics with the same namespace on reg).
//
// It registers:
//
//	pelican_jobs_processed_total{stream,type,outcome}  counter: jobs by the chain's outcome
//	pelican_job_duration_seconds{stream,type}          histogram: time in the chain
//	pelican_job_wait_seconds{stream,type}              histogram: from the entry's enqueue (its ID) to the start
//	pelican_job_latency_seconds{stream,type}           histogram: from created_at to done (ack), retries included
//	pelican_jobs_in_flight{stream,type}                gauge: jobs in the chain now
//	pelican_retries_total{stream,type}                 counter: retries scheduled
//	pelican_dead_letters_total{stream,type,reason}     counter: jobs dead-lettered, by reason
//	pelican_lock_conflicts_total                       counter: jobs snoozed because their lock was held
//	pelican_locks_lost_total{stream,type}              counter: jobs whose lock was lost while they ran
//	pelican_idempotency_hits_total{stream,type}        counter: jobs acknowledged without running (done earlier)
func New(reg prometheus.Registerer, cfg Config) *Metrics {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Buckets == nil {
		cfg.Buckets = DefaultBuckets
	}
	if cfg.LatencyBuckets == nil {
		cfg.LatencyBuckets = DefaultLatencyBuckets
	}
	if cfg.MaxTypes <= 0 {
		cfg.MaxTypes = DefaultMaxTypes
	}
	ns := cfg.Namespace
	st := []string{"stream", "type"}
	m := &Metrics{
		cfg:   cfg,
		types: make(map[string]struct{}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "jobs_processed_total",
			Help: "Jobs that went through the handler chain, by the chain's outcome (ack, retry, snooze, dead_letter, abandoned, cancelled)."},
			[]string{"stream", "type", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_duration_seconds",
			Help: "Time jobs spent in the handler chain.", Buckets: cfg.Buckets}, st),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_wait_seconds",
			Help: "Time from a job's entry being added to the stream to its start.", Buckets: cfg.LatencyBuckets}, st),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_latency_seconds",
			Help: "Time from a job's created_at to its successful end, retries included.", Buckets: cfg.LatencyBuckets}, st),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "jobs_in_flight",
			Help: "Jobs in the handler chain now."}, st),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Jobs scheduled for another attempt."}, st),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dead_letters_total",
			Help: "Jobs dead-lettered by the handler chain, by reason."}, []string{"stream", "type", "reason"}),
		lockConflicts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "lock_conflicts_total",
			Help: "Jobs snoozed because their lock was held elsewhere."}),
		locksLost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "locks_lost_total",
			Help: "Jobs whose lock was lost while they ran."}, st),
		idemHits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "idempotency_hits_total",
			Help: "Jobs acknowledged without running because their operation had completed."}, st),
	}
	reg.MustRegister(m.processed, m.duration, m.wait, m.latency, m.inFlight, m.retries, m.deadLetters,
		m.lockConflicts, m.locksLost, m.idemHits)
	return m
}

// seriesOf returns the children of (streamName, typ), bounding the type
// label to cfg.MaxTypes values.
func (m *Metrics) seriesOf(streamName, typ string) *series {
	k := seriesKey{streamName, typ}
	if s, ok := m.cache.Load(k); ok {
		return s.(*series)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.cache.Load(k); ok {
		return s.(*series)
	}
	if _, known := m.types[typ]; !known {
		if len(m.types) >= m.cfg.MaxTypes {
			// Not cached under its own type, so that types without end
			// cannot grow the cache either.
			k = seriesKey{streamName, OtherType}
			if s, ok := m.cache.Load(k); ok {
				return s.(*series)
			}
			typ = OtherType
		} else {
			m.types[typ] = struct{}{}
		}
	}
	p := func(outcome string) prometheus.Counter { return m.processed.WithLabelValues(streamName, typ, outcome) }
	s := &series{
		stream: streamName, typ: typ,
		ack: p(OutcomeAck), retry: p(OutcomeRetry), snooze: p(OutcomeSnooze), dead: p(OutcomeDeadLetter),
		aband:     p(OutcomeAbandoned),
		cancel:    p(OutcomeCancelled),
		retries:   m.retries.WithLabelValues(streamName, typ),
		idemHits:  m.idemHits.WithLabelValues(streamName, typ),
		locksLost: m.locksLost.WithLabelValues(streamName, typ),
		inFlight:  m.inFlight.WithLabelValues(streamName, typ),
		duration:  m.duration.WithLabelValues(streamName, typ),
		wait:      m.wait.WithLabelValues(streamName, typ),
		latency:   m.latency.WithLabelValues(streamName, typ),
	}
	m.cache.Store(k, s)
	return s
}

// Middleware returns the middleware that measures every job: put it first
// in consumer.Consumer.Use (outermost; after tracing if any), so that it
// sees the final decision of every other middleware.
//
// Before the job runs it observes pelican_job_wait_seconds (now minus the
// time in the entry's ID: for a retry, since it left the delayed set) and
// raises pelican_jobs_in_flight; after, it observes
// pelican_job_duration_seconds and counts the outcome, the consumer's
// decision about what the chain returned ([consumer.Decide]), and for an
// acknowledged job observes pelican_job_latency_seconds (now minus
// created_at). A panic is counted as the consumer decides it (a dead
// letter with reason "panic" by default) and passes on to the consumer,
// which recovers it.
func (m *Metrics) Middleware() consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) (err error) {
			s := m.seriesOf(job.Stream, job.Type)
			start := time.Now()
			if t, ok := stream.EntryTime(job.EntryID); ok {
				s.wait.Observe(max(start.Sub(t).Seconds(), 0))
			}
			s.inFlight.Inc()
			panicked := true
			defer func() {
				end := time.Now()
				s.inFlight.Dec()
				s.duration.Observe(end.Sub(start).Seconds())
				if panicked {
					m.count(s, job, consumer.Decide(ctx, job, &consumer.PanicError{}), end)
				} else {
					m.count(s, job, consumer.Decide(ctx, job, err), end)
				}
			}()
			err = next.Process(ctx, job)
			panicked = false
			return err
		})
	}
}

func (m *Metrics) count(s *series, job *stream.Job, d consumer.Decision, end time.Time) {
	switch d.Kind {
	case consumer.KindAck:
		s.ack.Inc()
		if !job.CreatedAt.IsZero() {
			s.latency.Observe(max(end.Sub(job.CreatedAt).Seconds(), 0))
		}
	case consumer.KindRetry:
		s.retry.Inc()
		s.retries.Inc()
	case consumer.KindSnooze:
		s.snooze.Inc()
	case consumer.KindDead:
		s.dead.Inc()
		m.deadLetters.WithLabelValues(s.stream, s.typ, d.Reason).Inc()
	case consumer.KindCancelled:
		s.cancel.Inc()
	default:
		s.aband.Inc()
	}
}

// LockConflict counts a job snoozed because its lock was held elsewhere
// (pelican_lock_conflicts_total). It has the shape of
// middleware.LockConfig.OnConflict; the key is not a label (lock keys are
// unbounded), and since the hook is given no job the counter has no stream
// label: pelican_jobs_processed_total{outcome="snooze"} has the per-type view.
func (m *Metrics) LockConflict(key string) { m.lockConflicts.Inc() }

// IdempotencyHit counts a job acknowledged without running because its
// operation had completed earlier (pelican_idempotency_hits_total). It has
// the shape of middleware.IdempotencyConfig.OnHit.
func (m *Metrics) IdempotencyHit(ctx context.Context, job *stream.Job, result []byte) {
	m.seriesOf(job.Stream, job.Type).idemHits.Inc()
}

// LockLost returns a middleware that counts the jobs whose context was
// cancelled because their lock was lost while they ran (a cause matching
// lockx.ErrLockLost; pelican_locks_lost_total). middleware.Lock cancels the
// context it gives the handler, which the outer [Metrics.Middleware] does
// not see: place this one inside middleware.Lock (innermost is fine).
func (m *Metrics) LockLost() consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
			defer func() {
				if errors.Is(context.Cause(ctx), lockx.ErrLockLost) {
					m.seriesOf(job.Stream, job.Type).locksLost.Inc()
				}
			}()
			return next.Process(ctx, job)
		})
	}
}

// Processed returns the pelican_jobs_processed_total counter of one stream,
// job type (as labelled: see Config.MaxTypes) and outcome, to read counts
// in process or in tests (prometheus/testutil.ToFloat64).
func (m *Metrics) Processed(streamName, typ, outcome string) prometheus.Counter {
	return m.processed.WithLabelValues(streamName, typ, outcome)
}
