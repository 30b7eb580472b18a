package main

import (
	"fmt"
	"sort"

	"github.com/pelicanqueue/pelican/stream"
)

// A partitioned queue (stream.Partitions) is one queue to the CLI: stats
// without arguments groups the partition streams it finds by their queue
// (a name is a partition only if it is exactly what stream.Partitions
// computes), and --partitions N makes every STREAM argument the name of a
// queue of N partitions. Its figures are the sums over its partitions, with
// a per-partition breakdown.

// queueRef is a stream or a partitioned queue named on the command line or
// found by SCAN.
type queueRef struct {
	name       string
	n          int      // the partition count
	partitions []string // nil for a plain stream
}

// streams returns the streams of the queue.
func (q queueRef) streams() []string {
	if q.partitions == nil {
		return []string{q.name}
	}
	return q.partitions
}

// partitionedRefs returns the queues of n partitions named by names.
func partitionedRefs(names []string, n int) ([]queueRef, error) {
	refs := make([]queueRef, 0, len(names))
	for _, name := range names {
		parts, err := stream.Partitions(name, n)
		if err != nil {
			return nil, fail(exitUsage, "queue %q: %v", name, err)
		}
		refs = append(refs, queueRef{name: name, n: n, partitions: parts})
	}
	return refs, nil
}

// groupPartitions turns the streams SCAN found into queues: partition
// streams of one queue and count become one queueRef (holding the
// partitions found, in partition order), every other stream its own.
func groupPartitions(names []string) []queueRef {
	type key struct {
		queue string
		n     int
	}
	found := map[key]map[int]string{}
	var refs []queueRef
	for _, s := range names {
		q, n, i, ok := stream.ParsePartition(s)
		if !ok {
			refs = append(refs, queueRef{name: s})
			continue
		}
		k := key{q, n}
		if found[k] == nil {
			found[k] = map[int]string{}
		}
		found[k][i] = s
	}
	for k, parts := range found {
		idx := make([]int, 0, len(parts))
		for i := range parts {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		ref := queueRef{name: k.queue, n: k.n}
		for _, i := range idx {
			ref.partitions = append(ref.partitions, parts[i])
		}
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].name < refs[j].name })
	return refs
}

// mergeStats returns a partitioned queue's stats: sums over its
// partitions (pending, lag and consumers' pending per group name; the
// oldest pending entry of all; a consumer's smallest idle time), with the
// partitions' own stats in Partitions.
func mergeStats(name string, n int, parts []streamStats) streamStats {
	m := streamStats{Stream: name, PartitionCount: n, DeadByReason: map[string]int64{}, Groups: []groupStats{}, Partitions: parts}
	groups := map[string]*groupStats{}
	var order []string
	for _, p := range parts {
		m.Length += p.Length
		m.Delayed += p.Delayed
		m.DeadLetters += p.DeadLetters
		m.DeadScanned += p.DeadScanned
		m.DeadCapped = m.DeadCapped || p.DeadCapped
		for r, c := range p.DeadByReason {
			m.DeadByReason[r] += c
		}
		for _, g := range p.Groups {
			mg := groups[g.Name]
			if mg == nil {
				lag := int64(0)
				mg = &groupStats{Name: g.Name, Lag: &lag, Consumers: []consumerStats{}}
				groups[g.Name] = mg
				order = append(order, g.Name)
			}
			mg.Pending += g.Pending
			if g.Lag == nil || mg.Lag == nil {
				mg.Lag = nil
			} else {
				*mg.Lag += *g.Lag
			}
			if g.OldestPendingIdle != nil && (mg.OldestPendingIdle == nil || *g.OldestPendingIdle > *mg.OldestPendingIdle) {
				mg.OldestPendingIdle = g.OldestPendingIdle
			}
			if g.OldestPendingID != "" && (mg.OldestPendingID == "" || stream.CompareIDs(g.OldestPendingID, mg.OldestPendingID) < 0) {
				mg.OldestPendingID, mg.OldestPendingAge = g.OldestPendingID, g.OldestPendingAge
			}
			for _, c := range g.Consumers {
				merged := false
				for k := range mg.Consumers {
					if mg.Consumers[k].Name == c.Name {
						mg.Consumers[k].Pending += c.Pending
						mg.Consumers[k].Idle = min(mg.Consumers[k].Idle, c.Idle)
						merged = true
					}
				}
				if !merged {
					mg.Consumers = append(mg.Consumers, c)
				}
			}
		}
	}
	sort.Strings(order)
	for _, g := range order {
		m.Groups = append(m.Groups, *groups[g])
	}
	return m
}

// printPartitions writes a partitioned queue's per-partition breakdown.
func printPartitions(a *app, st streamStats) error {
	fmt.Fprintln(a.out)
	t := newTable(a, "PARTITION", "LENGTH", "DELAYED", "DEAD", "PENDING", "LAG")
	for _, p := range st.Partitions {
		var pending int64
		lag := new(int64)
		for _, g := range p.Groups {
			pending += g.Pending
			if g.Lag == nil || lag == nil {
				lag = nil
			} else {
				*lag += *g.Lag
			}
		}
		t.Row(p.Stream, p.Length, p.Delayed, p.DeadLetters, pending, lag)
	}
	return t.Flush()
}
