package dashboard

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/stream"
)

// partitions returns the partition streams of queue when Config.Partitions
// names it, nil otherwise.
func (d *Dashboard) partitions(queue string) []string { return d.parts[queue] }

// partitionNames computes the streams of every queue of Config.Partitions
// (validated before).
func partitionNames(cfg map[string]int) (map[string][]string, error) {
	out := make(map[string][]string, len(cfg))
	for q, n := range cfg {
		s, err := stream.Partitions(q, n)
		if err != nil {
			return nil, fmt.Errorf("dashboard: Config.Partitions[%q]: %w", q, err)
		}
		out[q] = s
	}
	return out, nil
}

// validPartitions reports the first bad queue of Config.Partitions, in
// name order.
func validPartitions(cfg map[string]int) error {
	names := make([]string, 0, len(cfg))
	for q := range cfg {
		names = append(names, q)
	}
	sort.Strings(names)
	for _, q := range names {
		if _, err := stream.PartitionStream(q, cfg[q], 0); err != nil {
			return fmt.Errorf("dashboard: Config.Partitions[%q] (%d): %w", q, cfg[q], err)
		}
	}
	return nil
}

// partRow is one partition of a partitioned queue, as the breakdown shows
// it.
type partRow struct {
	Index    int
	Q        queuestats.Queue
	NotFound bool // never written to: counted as empty
	Pauses   pauseView
}

// mergeQueue returns the state of the partitioned queue name from its
// partitions' states (in partition order): sums of lengths, delayed, dead
// letters and their reasons, groups merged by name (pending and lag
// summed, the oldest pending entry over every partition). A partition that
// does not exist counts as empty; the queue is ErrNotFound when none
// exists, and has the first other error of a partition.
func mergeQueue(name string, parts []queuestats.Queue) queuestats.Queue {
	m := queuestats.Queue{Stream: name, DeadByReason: map[string]int64{}}
	found := false
	groups := map[string]int{}
	for _, p := range parts {
		if isNotFound(p.Err) {
			continue
		}
		found = true
		if p.Err != nil && m.Err == nil {
			m.Err = fmt.Errorf("partition %s: %w", p.Stream, p.Err)
		}
		m.Length += p.Length
		m.Delayed += p.Delayed
		m.DeadLetters += p.DeadLetters
		m.DeadScanned += p.DeadScanned
		m.DeadCapped = m.DeadCapped || p.DeadCapped
		if m.ReasonsErr == nil {
			m.ReasonsErr = p.ReasonsErr
		}
		for r, n := range p.DeadByReason {
			m.DeadByReason[r] += n
		}
		if p.Added < 0 || m.Added < 0 {
			m.Added = -1
		} else {
			m.Added += p.Added
		}
		for _, g := range p.Groups {
			i, ok := groups[g.Name]
			if !ok {
				i = len(m.Groups)
				groups[g.Name] = i
				m.Groups = append(m.Groups, queuestats.Group{Name: g.Name})
			}
			mg := &m.Groups[i]
			mg.Pending += g.Pending
			mg.Lag = sumKnown(mg.Lag, g.Lag, ok)
			mg.EntriesRead = sumKnown(mg.EntriesRead, g.EntriesRead, ok)
			if g.OldestPendingID != "" && (mg.OldestPendingID == "" || g.OldestPendingAge > mg.OldestPendingAge) {
				mg.OldestPendingID, mg.OldestPendingAge, mg.OldestPendingIdle = g.OldestPendingID, g.OldestPendingAge, g.OldestPendingIdle
			}
			mg.Consumers = append(mg.Consumers, g.Consumers...)
		}
	}
	if !found {
		m.Err = fmt.Errorf("%w: none of the %d partitions of %s exists", queuestats.ErrNotFound, len(parts), name)
		m.Added = -1
	}
	return m
}

// sumKnown adds b to a, -1 (unknown) when either is; a is unset when !had.
func sumKnown(a, b int64, had bool) int64 {
	switch {
	case !had:
		return b
	case a < 0 || b < 0:
		return -1
	}
	return a + b
}

// collect reads the queues named (plain streams, and the partitioned
// queues of Config.Partitions) with queuestats.Collect in one call, and
// returns each queue's state, partitioned ones merged, with the states of
// their partitions.
func (d *Dashboard) collect(ctx context.Context, names []string) ([]queuestats.Queue, [][]queuestats.Queue, time.Time, error) {
	var all []string
	for _, n := range names {
		if ps := d.partitions(n); ps != nil {
			all = append(all, ps...)
		} else {
			all = append(all, n)
		}
	}
	qs, now, err := queuestats.Collect(ctx, d.rdb, all, queuestats.Options{ReasonScan: d.cfg.ReasonScan})
	if err != nil {
		return nil, nil, now, err
	}
	out := make([]queuestats.Queue, len(names))
	parts := make([][]queuestats.Queue, len(names))
	i := 0
	for k, n := range names {
		ps := d.partitions(n)
		if ps == nil {
			out[k] = qs[i]
			i++
			continue
		}
		parts[k] = qs[i : i+len(ps)]
		i += len(ps)
		out[k] = mergeQueue(n, parts[k])
	}
	return out, parts, now, nil
}
