package metrics

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [CollectorConfig].
const (
	// DefaultCacheFor is how long the queue state read from Redis is reused.
	DefaultCacheFor = 5 * time.Second
	// DefaultTimeout bounds one refresh of the queue state.
	DefaultTimeout = 3 * time.Second
)

// PartitionedQueue returns the Queues of the n partitions of a partitioned
// queue (stream.Partitions), each with groups, for CollectorConfig.Queues.
// Their series carry each partition's stream label, and
// pelican_stream_partition_info maps the streams to the queue, so that one
// query sums a queue over its partitions:
//
//	sum by (queue, group) (pelican_pending_jobs * on (stream) group_left (queue) pelican_stream_partition_info)
func PartitionedQueue(queue string, n int, groups ...string) ([]Queue, error) {
	streams, err := stream.Partitions(queue, n)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	qs := make([]Queue, len(streams))
	for i, s := range streams {
		qs[i] = Queue{Stream: s, Groups: groups}
	}
	return qs, nil
}

// Queue names one queue whose state the collector reads.
type Queue struct {
	// DeadLetterStream is the queue's dead-letter stream. Defaults to
	// stream.KeysFor(Stream).Dead, as the consumer's.
	DeadLetterStream string
	// Groups are the consumer groups to report on. Required.
	Groups []string
	// Stream is the job stream. Required.
	Stream string
}

// ConsumerStats names a running consumer whose counters the collector
// exports. Counters of consumers with the same Stream and Group are summed.
type ConsumerStats struct {
	// Group is the consumer's group, for the group label.
	Group string
	// Stats returns the consumer's counters: pass consumer.Consumer.Stats.
	Stats func() consumer.Stats
	// Stream is the consumer's stream, for the stream label.
	Stream string
}

// CollectorConfig configures [NewCollector].
type CollectorConfig struct {
	// CacheFor is how long the state read from Redis is reused: scrapes
	// within it (concurrent ones included) share one refresh. Defaults to
	// [DefaultCacheFor].
	CacheFor time.Duration
	// Consumers are running consumers whose counters are exported. Defaults
	// to nil.
	Consumers []ConsumerStats
	// Namespace starts every metric name. Defaults to [DefaultNamespace].
	Namespace string
	// Queues are the queues whose state is read from Redis.
	Queues []Queue
	// Timeout bounds one refresh. Defaults to [DefaultTimeout].
	Timeout time.Duration
}

// Collector is the prometheus.Collector made by [NewCollector].
type Collector struct {
	rdb    redis.UniversalClient
	cfg    CollectorConfig
	queues []Queue // defaults applied
	now    func() time.Time
	err    error // what CollectorConfig.Validate said; Collect reports it

	streamLen, pending, lag, oldestAge, oldestIdle, delayed, deadLen *prometheus.Desc
	paused                                                           *prometheus.Desc
	up, errorsTotal, partitionInfo                                   *prometheus.Desc
	settled, reclaimed, lost, stale, leaseLost, readErrors, trimmed  *prometheus.Desc

	mu      sync.Mutex // held during a refresh, so concurrent scrapes share it
	at      time.Time  // when snap was read; zero: never
	snap    []queueState
	ok      bool   // the last refresh succeeded
	errs    uint64 // refreshes that failed
	lastErr error
}

// queueState is one queue's state read from Redis.
type queueState struct {
	stream        string
	length        int64
	delayed, dead int64
	groups        []groupState
	// pauses is what is paused (package control); nil when the Redis user
	// may not read it.
	pauses *control.Paused
}

type groupState struct {
	name           string
	pending        int64
	lag            int64 // -1: unknown
	oldest         bool  // the PEL is not empty: the oldest* fields are set
	oldestAge      time.Duration
	oldestIdleTime time.Duration
}

// Validate reports the first queue of c that is not valid, naming the
// field: each needs a Stream that stream.KeysFor accepts, and Groups.
func (c CollectorConfig) Validate() error {
	for i, q := range c.Queues {
		if q.Stream == "" || len(q.Groups) == 0 {
			return fmt.Errorf("metrics: CollectorConfig.Queues[%d] needs a Stream and Groups", i)
		}
		if _, err := stream.KeysFor(q.Stream); err != nil {
			return fmt.Errorf("metrics: CollectorConfig.Queues[%d].Stream: %w", i, err)
		}
	}
	return nil
}

// NewCollector returns a collector of the queues' state in Redis and of
// the consumers' counters. Register it with a prometheus.Registerer. It
// does not fail: a cfg that [CollectorConfig.Validate] rejects collects
// nothing, and every Gather returns that error, naming the field, without
// touching Redis.
//
// On a scrape older than cfg.CacheFor since the last refresh it reads, in
// one pipelined round trip: XLEN of each stream and dead-letter stream,
// XINFO GROUPS (pending count and lag), ZCARD of the delayed set, the
// lowest pending entry of each group (XPENDING … - + 1), the queue's pauses
// (HGETALL; left out for a Redis user that may not read them) and the
// server's TIME. It exports:
//
//	pelican_stream_length{stream}                       gauge: entries in the stream (XLEN)
//	pelican_pending_jobs{stream,group}                  gauge: entries delivered and not acknowledged (the PEL)
//	pelican_group_lag{stream,group}                     gauge: entries not yet delivered to the group
//	pelican_oldest_pending_seconds{stream,group}        gauge: age of the lowest pending entry (server time − its ID)
//	pelican_oldest_pending_idle_seconds{stream,group}   gauge: time since that entry was last delivered or extended
//	pelican_delayed_jobs{stream}                        gauge: jobs waiting in the delayed set
//	pelican_dead_letter_stream_length{stream}           gauge: entries in the dead-letter stream
//	pelican_stream_partition_info{stream,queue,partition,partitions}  gauge: 1 for a stream that is a partition (stream.Partitions)
//	pelican_paused{stream,type}                         gauge: 1 while paused (package control); type "" is the whole
//	                                                    queue (always exported, 0 when running), a type's series only while paused
//	pelican_collector_up                                gauge: 1 if the last refresh succeeded
//	pelican_collector_errors_total                      counter: failed refreshes
//
// and for cfg.Consumers (read at every scrape, not cached):
//
//	pelican_settled_total{stream,group,outcome}          counter: settlements applied (ack, retry, dead_letter)
//	pelican_reclaimed_total{stream,group}                counter: entries taken over after the visibility timeout
//	pelican_lost_total{stream,group}                     counter: pending entries found deleted or trimmed
//	pelican_stale_settlements_total{stream,group}        counter: settlements refused (no longer the owner)
//	pelican_lease_lost_total{stream,group}               counter: running jobs whose lease was lost
//	pelican_read_errors_total{stream,group}              counter: failed reads
//	pelican_dead_trimmed_total{stream,group}             counter: dead letters trimmed by DeadLetterMaxLen
//
// pelican_settled_total differs from pelican_jobs_processed_total: it counts
// what the core applied, entries that never reached a handler included.
//
// A failed refresh never fails the scrape: the queue series are left out,
// pelican_collector_up is 0 and pelican_collector_errors_total grows. The
// group lag is left out when Redis cannot tell it (the group was set to an
// arbitrary ID, or unread entries were deleted: see XINFO GROUPS), and for
// a group with nothing pending the oldest-pending series are left out.
// miniredis reports the lag wrong (the stream's length) and only counts
// pending entries still in the stream: use a real Redis for these.
func NewCollector(rdb redis.UniversalClient, cfg CollectorConfig) *Collector {
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = DefaultCacheFor
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	err := cfg.Validate()
	var queues []Queue
	for _, q := range cfg.Queues {
		if err != nil {
			break // a bad config collects nothing but its error
		}
		if q.DeadLetterStream == "" {
			keys, _ := stream.KeysFor(q.Stream)
			q.DeadLetterStream = keys.Dead
		}
		queues = append(queues, q)
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(cfg.Namespace, "", name), help, labels, nil)
	}
	sg := []string{"stream", "group"}
	return &Collector{
		rdb: rdb, cfg: cfg, queues: queues, now: time.Now, err: err,
		streamLen:  d("stream_length", "Entries in the job stream (XLEN).", "stream"),
		pending:    d("pending_jobs", "Entries delivered to the group and not acknowledged (its pending entries list).", sg...),
		lag:        d("group_lag", "Entries of the stream not yet delivered to the group (XINFO GROUPS lag).", sg...),
		oldestAge:  d("oldest_pending_seconds", "Age of the group's lowest pending entry: server time minus the time in its ID.", sg...),
		oldestIdle: d("oldest_pending_idle_seconds", "Time since the group's lowest pending entry was last delivered or extended.", sg...),
		delayed:    d("delayed_jobs", "Jobs waiting in the delayed set for a later attempt.", "stream"),
		deadLen:    d("dead_letter_stream_length", "Entries in the dead-letter stream (XLEN).", "stream"),
		paused:     d("paused", "1 while the queue (type \"\") or one of its job types is paused (package control).", "stream", "type"),
		up:         d("collector_up", "1 if the collector's last read of the queue state from Redis succeeded, else 0."),
		partitionInfo: d("stream_partition_info", "1 for each stream that is a partition of a partitioned queue (stream.Partitions): its queue and partition index.",
			"stream", "queue", "partition", "partitions"),
		errorsTotal: d("collector_errors_total", "Reads of the queue state from Redis that failed."),
		settled:     d("settled_total", "Settlements the consumers applied, by outcome (ack, retry, dead_letter).", "stream", "group", "outcome"),
		reclaimed:   d("reclaimed_total", "Entries the consumers took over after the visibility timeout.", sg...),
		lost:        d("lost_total", "Pending entries the consumers found deleted or trimmed from the stream.", sg...),
		stale:       d("stale_settlements_total", "Settlements refused because the consumer no longer owned the entry.", sg...),
		leaseLost:   d("lease_lost_total", "Running jobs whose lease was lost.", sg...),
		readErrors:  d("read_errors_total", "Failed reads from Redis by the consumers.", sg...),
		trimmed:     d("dead_trimmed_total", "Dead-letter entries trimmed because the dead-letter stream was over its maximum length.", sg...),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.streamLen, c.pending, c.lag, c.oldestAge, c.oldestIdle, c.delayed,
		c.deadLen, c.paused, c.up, c.errorsTotal, c.partitionInfo, c.settled, c.reclaimed, c.lost, c.stale, c.leaseLost, c.readErrors, c.trimmed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.err != nil {
		ch <- prometheus.NewInvalidMetric(c.up, c.err) // Gather fails with it
		return
	}
	snap, ok, errs := c.state()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, q := range c.queues {
		if queue, n, i, isPart := stream.ParsePartition(q.Stream); isPart {
			gauge(c.partitionInfo, 1, q.Stream, queue, strconv.Itoa(i), strconv.Itoa(n))
		}
	}
	up := 0.0
	if ok {
		up = 1
		for _, q := range snap {
			gauge(c.streamLen, float64(q.length), q.stream)
			gauge(c.delayed, float64(q.delayed), q.stream)
			gauge(c.deadLen, float64(q.dead), q.stream)
			if q.pauses != nil {
				v := 0.0
				if q.pauses.Queue {
					v = 1
				}
				gauge(c.paused, v, q.stream, "")
				for _, t := range q.pauses.TypeNames() {
					gauge(c.paused, 1, q.stream, t)
				}
			}
			for _, g := range q.groups {
				gauge(c.pending, float64(g.pending), q.stream, g.name)
				if g.lag >= 0 {
					gauge(c.lag, float64(g.lag), q.stream, g.name)
				}
				if g.oldest {
					gauge(c.oldestAge, g.oldestAge.Seconds(), q.stream, g.name)
					gauge(c.oldestIdle, g.oldestIdleTime.Seconds(), q.stream, g.name)
				}
			}
		}
	}
	gauge(c.up, up)
	ch <- prometheus.MustNewConstMetric(c.errorsTotal, prometheus.CounterValue, float64(errs))
	c.collectConsumers(ch)
}

func (c *Collector) collectConsumers(ch chan<- prometheus.Metric) {
	type sg struct{ stream, group string }
	sums := map[sg]*consumer.Stats{}
	var order []sg
	for _, cs := range c.cfg.Consumers {
		if cs.Stats == nil {
			continue
		}
		k := sg{cs.Stream, cs.Group}
		s := sums[k]
		if s == nil {
			s = &consumer.Stats{}
			sums[k] = s
			order = append(order, k)
		}
		st := cs.Stats()
		s.Acked += st.Acked
		s.Retried += st.Retried
		s.DeadLettered += st.DeadLettered
		s.Reclaimed += st.Reclaimed
		s.Lost += st.Lost
		s.Stale += st.Stale
		s.LeaseLost += st.LeaseLost
		s.ReadErrors += st.ReadErrors
		s.DeadTrimmed += st.DeadTrimmed
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, k := range order {
		s := sums[k]
		counter(c.settled, s.Acked, k.stream, k.group, OutcomeAck)
		counter(c.settled, s.Retried, k.stream, k.group, OutcomeRetry)
		counter(c.settled, s.DeadLettered, k.stream, k.group, OutcomeDeadLetter)
		counter(c.reclaimed, s.Reclaimed, k.stream, k.group)
		counter(c.lost, s.Lost, k.stream, k.group)
		counter(c.stale, s.Stale, k.stream, k.group)
		counter(c.leaseLost, s.LeaseLost, k.stream, k.group)
		counter(c.readErrors, s.ReadErrors, k.stream, k.group)
		counter(c.trimmed, s.DeadTrimmed, k.stream, k.group)
	}
}

// state returns the cached queue state, refreshing it if it is older than
// CacheFor. Callers arriving during a refresh wait for it and share it.
func (c *Collector) state() ([]queueState, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queues) == 0 {
		return nil, true, c.errs
	}
	if c.at.IsZero() || c.now().Sub(c.at) >= c.cfg.CacheFor {
		snap, err := c.read()
		c.at = c.now()
		c.ok = err == nil
		c.lastErr = err
		if err != nil {
			c.errs++
			c.snap = nil
		} else {
			c.snap = snap
		}
	}
	return c.snap, c.ok, c.errs
}

// Err returns the error of the last refresh, or nil.
func (c *Collector) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// read reads every queue's state in one pipeline.
func (c *Collector) read() ([]queueState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	type cmds struct {
		length, delayed, dead *redis.IntCmd
		groups                *redis.XInfoGroupsCmd
		oldest                []*redis.XPendingExtCmd
		paused                *redis.MapStringStringCmd
	}
	all := make([]cmds, len(c.queues))
	var timeCmd *redis.TimeCmd
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		timeCmd = p.Time(ctx)
		for i, q := range c.queues {
			keys, _ := stream.KeysFor(q.Stream) // checked in NewCollector
			all[i].length = p.XLen(ctx, q.Stream)
			all[i].delayed = p.ZCard(ctx, keys.Delayed)
			all[i].dead = p.XLen(ctx, q.DeadLetterStream)
			all[i].groups = p.XInfoGroups(ctx, q.Stream)
			all[i].paused = p.HGetAll(ctx, keys.Paused)
			for _, g := range q.Groups {
				all[i].oldest = append(all[i].oldest, p.XPendingExt(ctx, &redis.XPendingExtArgs{
					Stream: q.Stream, Group: g, Start: "-", End: "+", Count: 1}))
			}
		}
		return nil
	})
	if err != nil && !absent(err) && !strings.HasPrefix(err.Error(), "NOPERM") && !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		return nil, err // each command's own error is looked at below
	}
	now, err := timeCmd.Result()
	if err != nil {
		return nil, err
	}
	snap := make([]queueState, len(c.queues))
	for i, q := range c.queues {
		s := queueState{stream: q.Stream}
		var errs []error
		s.length, err = all[i].length.Result()
		errs = append(errs, err)
		s.delayed, err = all[i].delayed.Result()
		errs = append(errs, err)
		s.dead, err = all[i].dead.Result()
		errs = append(errs, err)
		infos, gerr := all[i].groups.Result()
		if absent(gerr) {
			gerr = nil // no stream yet: no group
		}
		errs = append(errs, gerr)
		switch fields, perr := all[i].paused.Result(); {
		case perr == nil:
			ps := control.ParseState(now, fields)
			s.pauses = &ps
		case !strings.HasPrefix(perr.Error(), "NOPERM") && !strings.HasPrefix(perr.Error(), "WRONGTYPE"):
			// A pause key of the wrong kind (written by something else)
			// leaves the pauses out, as a user that may not read them
			// does; it must not blank every queue's series.
			errs = append(errs, perr)
		}
		for _, e := range errs {
			if e != nil {
				return nil, fmt.Errorf("metrics: reading queue %q: %w", q.Stream, e)
			}
		}
		for j, name := range q.Groups {
			var info *redis.XInfoGroup
			for k := range infos {
				if infos[k].Name == name {
					info = &infos[k]
				}
			}
			if info == nil {
				continue // not created yet
			}
			g := groupState{name: name, pending: info.Pending, lag: info.Lag}
			ext, perr := all[i].oldest[j].Result()
			switch {
			case absent(perr):
			case perr != nil:
				return nil, fmt.Errorf("metrics: reading queue %q group %q: %w", q.Stream, name, perr)
			case len(ext) > 0:
				g.oldest = true
				g.oldestIdleTime = ext[0].Idle
				if t, ok := stream.EntryTime(ext[0].ID); ok {
					g.oldestAge = max(now.Sub(t), 0)
				}
			}
			s.groups = append(s.groups, g)
		}
		snap[i] = s
	}
	return snap, nil
}

// absent reports whether err says the stream or group does not exist.
func absent(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOGROUP") || strings.Contains(msg, "no such key")
}
