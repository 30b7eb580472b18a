package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/stream"
)

func init() { commands = append(commands, newStatsCmd) }

// deadScanPage and deadScanCap bound the dead-letter scan of stats.
const (
	deadScanPage = 500
	deadScanCap  = 100_000
)

// streamStats is the state of one stream, as stats prints it.
type streamStats struct {
	Stream       string           `json:"stream"`
	Length       int64            `json:"length"`
	Delayed      int64            `json:"delayed"`
	DeadLetters  int64            `json:"dead_letters"`
	DeadByReason map[string]int64 `json:"dead_by_reason"`
	// DeadScanned is how many dead letters were read to count DeadByReason;
	// less than DeadLetters when the scan stopped at its cap.
	DeadScanned int64        `json:"dead_scanned"`
	DeadCapped  bool         `json:"dead_scan_capped"`
	Groups      []groupStats `json:"groups"`
	// PartitionCount and Partitions are, for a partitioned queue (whose
	// figures above are sums over its partitions), its partition count and
	// the partitions' own stats (those found, when SCAN found them).
	PartitionCount int           `json:"partition_count,omitempty"`
	Partitions     []streamStats `json:"partitions,omitempty"`
	// Paused lists the queue's pauses (package control); null when the
	// Redis user may not read them.
	Paused []pauseView `json:"paused"`
}

// groupStats is one consumer group of a stream.
type groupStats struct {
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
	// Lag is nil when Redis cannot tell it.
	Lag               *int64          `json:"lag"`
	LastDeliveredID   string          `json:"last_delivered_id"`
	OldestPendingID   string          `json:"oldest_pending_id,omitempty"`
	OldestPendingAge  *durationJSON   `json:"oldest_pending_age_ms,omitempty"`
	OldestPendingIdle *durationJSON   `json:"oldest_pending_idle_ms,omitempty"`
	Consumers         []consumerStats `json:"consumers"`
}

// consumerStats is one consumer of a group.
type consumerStats struct {
	Name    string       `json:"name"`
	Pending int64        `json:"pending"`
	Idle    durationJSON `json:"idle_ms"`
}

// durationJSON is a duration written as whole milliseconds in JSON.
type durationJSON time.Duration

func (d durationJSON) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprint(time.Duration(d).Milliseconds())), nil
}

func newStatsCmd(a *app) *cobra.Command {
	var watch time.Duration
	var watchCount, partitions int
	cmd := &cobra.Command{
		Use:   "stats [stream...]",
		Short: "Show length, lag, pending, delayed and dead letters of streams",
		Long: `stats shows, per stream and consumer group: length, lag, pending entries,
the age and idle time of the oldest pending entry, consumers (idle, pending),
delayed jobs and dead letters by reason. Without arguments it shows every
stream of the database (dead-letter streams, ending in ":dlq", excluded) that
the Redis user may read: others are skipped and counted on stderr, unnamed.
Dead letters are counted by reason over at most 100000 entries.

A partitioned queue (stream.Partitions) is shown as one queue, its figures
summed over its partitions, with a per-partition table: without arguments
the partition streams found are grouped by queue; --partitions N makes every
argument the name of a queue of N partitions (pelican stats orders
--partitions 12). A partition never written to counts as empty.

--watch [interval] redraws in place until interrupted (default every 2s).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				if watch <= 0 {
					return statsOnce(ctx, a, rdb, args, partitions, false)
				}
				for i := 0; watchCount == 0 || i < watchCount; i++ {
					if i > 0 {
						select {
						case <-ctx.Done():
							return nil
						case <-time.After(watch):
						}
					}
					if err := statsOnce(ctx, a, rdb, args, partitions, true); err != nil {
						if ctx.Err() != nil {
							return nil
						}
						return err
					}
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.DurationVarP(&watch, "watch", "w", 0, "refresh in place every interval until interrupted (--watch alone: 2s)")
	f.Lookup("watch").NoOptDefVal = "2s"
	f.IntVar(&partitions, "partitions", 0, "each argument names a partitioned queue of this many partitions")
	f.IntVar(&watchCount, "watch-count", 0, "stop after this many refreshes (for tests)")
	_ = f.MarkHidden("watch-count")
	return cmd
}

// statsOnce collects and prints the stats once; clear redraws the screen.
//
// Without names, it shows the streams SCAN finds that the Redis user may
// read: a stream whose keys it may not read (NOPERM), another team's under
// an ACL, is skipped and only counted, on stderr, so that its name appears
// nowhere; a user that may not SCAN is told to name its streams. A stream
// deleted between the SCAN and its reads is left out.
func statsOnce(ctx context.Context, a *app, rdb redis.UniversalClient, names []string, partitions int, clear bool) error {
	scanned := len(names) == 0
	var refs []queueRef
	switch {
	case partitions != 0 && scanned:
		return fail(exitUsage, "--partitions needs the queues' names")
	case partitions != 0:
		var err error
		if refs, err = partitionedRefs(names, partitions); err != nil {
			return err
		}
	case scanned:
		var err error
		if names, err = scanStreams(ctx, a, rdb); err != nil {
			return err
		}
		refs = groupPartitions(names)
	default:
		for _, s := range names {
			if _, err := stream.KeysFor(s); err != nil {
				return fail(exitUsage, "stream %q: %v", s, err)
			}
			if err := checkStream(ctx, rdb, s); err != nil {
				return err
			}
			refs = append(refs, queueRef{name: s})
		}
	}
	names = names[:0:0]
	partOf := map[string]bool{}
	for _, r := range refs {
		names = append(names, r.streams()...)
		if r.partitions != nil {
			for _, p := range r.partitions {
				partOf[p] = true
			}
		}
	}
	skipped := 0
	var missing []string
	streams, now, err := collectStats(ctx, rdb, names, func(stream string, err error) bool {
		switch {
		case scanned && queuestats.NoPerm(err):
			skipped++
			return true
		case (scanned || partOf[stream]) && errors.Is(err, queuestats.ErrNotFound):
			missing = append(missing, stream)
			return true // deleted since the SCAN found it, or a partition never written to
		}
		return false
	})
	if err != nil {
		return err
	}
	byName := map[string]streamStats{}
	for _, st := range streams {
		byName[st.Stream] = st
	}
	var all []streamStats
	for _, r := range refs {
		if r.partitions == nil {
			if st, ok := byName[r.name]; ok {
				all = append(all, st)
			}
			continue
		}
		parts := make([]streamStats, 0, len(r.partitions))
		for _, p := range r.partitions {
			st, ok := byName[p]
			if !ok {
				st = streamStats{Stream: p, DeadByReason: map[string]int64{}, Groups: []groupStats{}}
			}
			parts = append(parts, st)
		}
		if !scanned && len(missing) > 0 {
			found := false
			for _, p := range r.partitions {
				_, ok := byName[p]
				found = found || ok
			}
			if !found {
				return fail(exitNotFound, "unknown queue %q: none of its %d partitions exists", r.name, len(r.partitions))
			}
		}
		all = append(all, mergeStats(r.name, r.n, parts))
	}
	if skipped > 0 {
		fmt.Fprintf(a.errOut, "pelican: skipped %d stream(s) that this Redis user may not read\n", skipped)
	}
	if clear {
		fmt.Fprint(a.out, "\x1b[H\x1b[2J")
	}
	if a.output == "json" {
		return printJSON(a, all)
	}
	if clear {
		fmt.Fprintf(a.out, "pelican stats  %s  (Ctrl-C to stop)\n\n", now.UTC().Format(time.RFC3339))
	}
	if len(all) == 0 {
		fmt.Fprintln(a.out, "no streams")
		return nil
	}
	for i, st := range all {
		if i > 0 {
			fmt.Fprintln(a.out)
		}
		if err := printStats(a, st); err != nil {
			return err
		}
	}
	return nil
}

// scanStreams returns the stream keys of the database (of every master in a
// cluster), sorted, without dead-letter streams (queuestats.Scan). A node
// where the user may not SCAN adds none, and a note on stderr.
func scanStreams(ctx context.Context, a *app, rdb redis.UniversalClient) ([]string, error) {
	keys, denied, err := queuestats.Scan(ctx, rdb)
	if err != nil {
		return nil, fail(exitError, "%w", err)
	}
	if denied {
		fmt.Fprintln(a.errOut, "pelican: this Redis user may not run SCAN, so stats cannot list the streams; name them: pelican stats STREAM...")
	}
	return keys, nil
}

// collectStats reads the state of the streams named (queuestats.Collect,
// two pipelined round trips for all of them), then counts each one's dead
// letters by reason. A stream's error is returned as a CLI error unless
// skip accepts it.
func collectStats(ctx context.Context, rdb redis.UniversalClient, names []string, skip func(stream string, err error) bool) ([]streamStats, time.Time, error) {
	for _, s := range names {
		if _, err := stream.KeysFor(s); err != nil {
			return nil, time.Time{}, fail(exitUsage, "stream %q: %v", s, err)
		}
	}
	qs, now, err := queuestats.Collect(ctx, rdb, names, queuestats.Options{ReasonScan: -1})
	if err != nil {
		return nil, now, fail(exitError, "%w", err)
	}
	all := make([]streamStats, 0, len(qs))
	for _, q := range qs {
		if q.Err != nil {
			if skip(q.Stream, q.Err) {
				continue
			}
			switch {
			case errors.Is(q.Err, queuestats.ErrNotFound):
				return nil, now, fail(exitNotFound, "unknown stream %q", q.Stream)
			case queuestats.WrongType(q.Err) && strings.HasPrefix(q.Err.Error(), "XLEN "+q.Stream+":"):
				return nil, now, fail(exitError, "wrong key type: %q is not a stream", q.Stream)
			}
			return nil, now, fail(exitError, "%w", q.Err)
		}
		st := streamStats{Stream: q.Stream, Length: q.Length, Delayed: q.Delayed, DeadLetters: q.DeadLetters,
			DeadByReason: map[string]int64{}, Groups: []groupStats{}}
		for _, g := range q.Groups {
			gst := groupStats{Name: g.Name, Pending: g.Pending, LastDeliveredID: g.LastDeliveredID, Consumers: []consumerStats{}}
			if g.Lag >= 0 {
				lag := g.Lag
				gst.Lag = &lag
			}
			for _, c := range g.Consumers {
				gst.Consumers = append(gst.Consumers, consumerStats{Name: c.Name, Pending: c.Pending, Idle: durationJSON(c.Idle)})
			}
			if g.OldestPendingID != "" {
				gst.OldestPendingID = g.OldestPendingID
				idle, age := durationJSON(g.OldestPendingIdle), durationJSON(g.OldestPendingAge)
				gst.OldestPendingIdle = &idle
				if _, ok := stream.EntryTime(g.OldestPendingID); ok {
					gst.OldestPendingAge = &age
				}
			}
			st.Groups = append(st.Groups, gst)
		}
		// A user that may not read the pauses (an ACL from before them)
		// gets the rest: Paused stays null, unknown.
		switch ps, err := control.State(ctx, rdb, q.Stream); {
		case err == nil:
			st.Paused = pauseList(ps)
		case !strings.Contains(err.Error(), ": NOPERM"):
			return nil, now, fail(exitError, "%w", err)
		}
		if st.DeadLetters > 0 {
			keys, _ := stream.KeysFor(q.Stream)
			if err := countDeadReasons(ctx, rdb, keys.Dead, &st); err != nil {
				return nil, now, err
			}
		}
		all = append(all, st)
	}
	return all, now, nil
}

// countDeadReasons reads the dead-letter stream in pages and counts its
// entries by dead_reason, up to deadScanCap entries.
func countDeadReasons(ctx context.Context, rdb redis.UniversalClient, dead string, st *streamStats) error {
	start := "-"
	for st.DeadScanned < deadScanCap {
		n := min(deadScanPage, deadScanCap-st.DeadScanned)
		msgs, err := rdb.XRangeN(ctx, dead, start, "+", n).Result()
		if err != nil {
			if wrongType(err) {
				return fail(exitError, "wrong key type: dead-letter key %q is not a stream", dead)
			}
			return fail(exitError, "XRANGE %s: %w", dead, err)
		}
		for _, m := range msgs {
			reason, _ := m.Values["dead_reason"].(string)
			if reason == "" {
				reason = "unknown"
			}
			st.DeadByReason[reason]++
		}
		st.DeadScanned += int64(len(msgs))
		if int64(len(msgs)) < n {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	// Stopped at the cap: capped only if entries remain.
	st.DeadCapped = st.DeadScanned < st.DeadLetters
	return nil
}

// printStats writes one stream's stats as tables.
func printStats(a *app, st streamStats) error {
	head, name := "STREAM", st.Stream
	if st.Partitions != nil {
		head, name = "QUEUE", fmt.Sprintf("%s (%d partitions)", st.Stream, st.PartitionCount)
	}
	t := newTable(a, head, "LENGTH", "DELAYED", "DEAD")
	t.Row(name, st.Length, st.Delayed, st.DeadLetters)
	if err := t.Flush(); err != nil {
		return err
	}
	if len(st.Paused) > 0 {
		fmt.Fprintln(a.out)
		t = newTable(a, "PAUSED", "UNTIL")
		for _, p := range st.Paused {
			what, until := "the queue", "resumed"
			if p.Type != "" {
				what = "type " + p.Type
			}
			if p.Until != nil {
				until = p.Until.Format(time.RFC3339)
			}
			t.Row(what, until)
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	if len(st.Groups) == 0 {
		fmt.Fprintln(a.out, "\nno consumer groups")
	} else {
		fmt.Fprintln(a.out)
		t = newTable(a, "GROUP", "PENDING", "LAG", "OLDEST PENDING", "AGE", "IDLE", "CONSUMERS")
		for _, g := range st.Groups {
			t.Row(g.Name, g.Pending, g.Lag, g.OldestPendingID, optDuration(g.OldestPendingAge), optDuration(g.OldestPendingIdle), len(g.Consumers))
		}
		if err := t.Flush(); err != nil {
			return err
		}
		var rows [][]any
		for _, g := range st.Groups {
			for _, c := range g.Consumers {
				rows = append(rows, []any{g.Name, c.Name, time.Duration(c.Idle), c.Pending})
			}
		}
		if len(rows) > 0 {
			fmt.Fprintln(a.out)
			t = newTable(a, "GROUP", "CONSUMER", "IDLE", "PENDING")
			for _, r := range rows {
				t.Row(r...)
			}
			if err := t.Flush(); err != nil {
				return err
			}
		}
	}
	if len(st.DeadByReason) > 0 {
		fmt.Fprintln(a.out)
		reasons := make([]string, 0, len(st.DeadByReason))
		for r := range st.DeadByReason {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		t = newTable(a, "DEAD REASON", "COUNT")
		for _, r := range reasons {
			t.Row(r, st.DeadByReason[r])
		}
		if err := t.Flush(); err != nil {
			return err
		}
		if st.DeadCapped {
			fmt.Fprintf(a.out, "(dead letters counted over the first %d of %d entries)\n", st.DeadScanned, st.DeadLetters)
		}
	}
	if st.Partitions != nil {
		return printPartitions(a, st)
	}
	return nil
}

func optDuration(d *durationJSON) any {
	if d == nil {
		return nil
	}
	return time.Duration(*d)
}
