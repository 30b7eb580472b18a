package dlq

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// Partitioned operates the dead letters of a partitioned queue
// (stream.Partitions) as one: each partition has its own dead-letter stream
// (a [DLQ] each, in its partition's slot), and Partitioned lists, counts,
// replays and purges them together, in one order: by dead-letter entry ID
// (the time each died, by its partition's Redis clock), equal IDs in
// partition order. A limit applies to the whole queue. A replayed job goes
// back to the partition it died in. It is safe for concurrent use.
type Partitioned struct {
	queue string
	parts []*DLQ
}

// NewPartitioned returns the dead letters of queue, partitioned into n
// streams (stream.Partitions(queue, n)). cfg applies to every partition;
// its DeadLetterStream must be empty (each partition has its default).
func NewPartitioned(rdb redis.UniversalClient, queue string, n int, cfg Config) (*Partitioned, error) {
	if cfg.DeadLetterStream != "" {
		return nil, fmt.Errorf("dlq: Config.DeadLetterStream (%q) must be empty for a partitioned queue: each partition has its own", cfg.DeadLetterStream)
	}
	streams, err := stream.Partitions(queue, n)
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	p := &Partitioned{queue: queue, parts: make([]*DLQ, 0, n)}
	for _, s := range streams {
		d, err := New(rdb, s, cfg)
		if err != nil {
			return nil, err
		}
		p.parts = append(p.parts, d)
	}
	return p, nil
}

// Queue returns the queue's name.
func (p *Partitioned) Queue() string { return p.queue }

// Partitions returns the DLQ of each partition, in partition order.
func (p *Partitioned) Partitions() []*DLQ { return p.parts }

// List returns up to limit entries matching f (limit 0 means
// [DefaultListLimit]) from every partition, in the order of the queue (by
// entry ID, equal IDs in partition order), starting after the position
// after ("" for the beginning). next is the position to pass as after for
// the following page, or "" when there are no more entries.
//
// A position is "<entry ID>@<partition>", such as "1700000000000-0@3": the
// entry with that ID in that partition (Entry.Stream names its dead-letter
// stream). The page after it holds the entries of partitions up to that
// one with greater IDs, and those of later partitions with that ID or
// greater.
func (p *Partitioned) List(ctx context.Context, f Filter, limit int, after string) (entries []Entry, next string, err error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	starts := make([]string, len(p.parts))
	for i := range starts {
		starts[i] = "-"
	}
	if after != "" {
		id, part, err := ParsePosition(after)
		if err != nil {
			return nil, "", fmt.Errorf("dlq: List: after: %w", err)
		}
		if part >= len(p.parts) {
			return nil, "", fmt.Errorf("dlq: List: after: partition %d of a queue of %d", part, len(p.parts))
		}
		for i := range starts {
			starts[i] = id
			if i <= part {
				starts[i] = "(" + id
			}
		}
	}
	m := newMerger(ctx, f, len(p.parts), func(i int) (*DLQ, string, string) { return p.parts[i], starts[i], "+" })
	defer m.close()
	last := -1
	for {
		i, e, err := m.peek()
		if err != nil {
			return nil, "", err
		}
		if i < 0 {
			return entries, "", nil
		}
		if len(entries) == limit {
			return entries, Position(entries[len(entries)-1].ID, last), nil
		}
		m.pop(i)
		entries = append(entries, e)
		last = i
	}
}

// Position returns the List position of entry id in partition part.
func Position(id string, part int) string { return id + "@" + strconv.Itoa(part) }

// ParsePosition parses a position of [Partitioned.List].
func ParsePosition(pos string) (id string, part int, err error) {
	id, ps, ok := strings.Cut(pos, "@")
	if !ok {
		return "", 0, fmt.Errorf("position %q: want <entry ID>@<partition>, such as 1700000000000-0@3", pos)
	}
	if _, err := stream.ParseID(id); err != nil {
		return "", 0, fmt.Errorf("position %q: %w", pos, err)
	}
	part, err = strconv.Atoi(ps)
	if err != nil || part < 0 || part >= stream.MaxPartitions {
		return "", 0, fmt.Errorf("position %q: partition %q must be a number from 0 to %d", pos, ps, stream.MaxPartitions-1)
	}
	return id, part, nil
}

// Get returns the entry with dead-letter entry ID id from whichever
// partition holds it (the first in partition order, if several do), or an
// error wrapping [ErrNotFound]. It reads every partition in one pipeline.
func (p *Partitioned) Get(ctx context.Context, id string) (Entry, error) {
	if _, err := stream.ParseID(id); err != nil {
		return Entry{}, fmt.Errorf("dlq: Get: %w", err)
	}
	rdb := p.parts[0].rdb
	cmds, err := rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for _, d := range p.parts {
			pl.Do(ctx, "XRANGE", d.dead, id, id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Entry{}, fmt.Errorf("dlq: Get %s: %w", id, err)
	}
	for i, c := range cmds {
		res, err := c.(*redis.Cmd).Slice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return Entry{}, fmt.Errorf("dlq: Get %s: %w", id, err)
		}
		es, err := parseEntries(p.parts[i].dead, res)
		if err != nil {
			return Entry{}, err
		}
		if len(es) > 0 {
			return es[0], nil
		}
	}
	return Entry{}, fmt.Errorf("%w: %s in the %d partitions of %s", ErrNotFound, id, len(p.parts), p.queue)
}

// FindJob returns the first entry (in the queue's order) whose job_id is
// jobID, or an error wrapping [ErrNotFound]. It reads the partition the ID
// routes to first (stream.PartitionOf, where a producer that routes by job
// ID put it), then the others: a miss reads every dead letter of the queue.
func (p *Partitioned) FindJob(ctx context.Context, jobID string) (Entry, error) {
	if jobID == "" {
		return Entry{}, fmt.Errorf("dlq: FindJob: empty job ID")
	}
	first := stream.PartitionOf(jobID, len(p.parts))
	order := []int{first}
	for i := range p.parts {
		if i != first {
			order = append(order, i)
		}
	}
	for _, i := range order {
		var found *Entry
		err := p.parts[i].scan(ctx, Filter{}, "-", "+", func(e Entry, _ bool) (bool, error) {
			if v, _ := e.Value(stream.FieldJobID); v == jobID {
				found = &e
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return Entry{}, err
		}
		if found != nil {
			return *found, nil
		}
	}
	return Entry{}, fmt.Errorf("%w: job %q in the %d partitions of %s", ErrNotFound, jobID, len(p.parts), p.queue)
}

// Count returns how many entries of all partitions match f.
func (p *Partitioned) Count(ctx context.Context, f Filter) (int, error) {
	n := 0
	for _, d := range p.parts {
		c, err := d.Count(ctx, f)
		n += c
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Replay is [DLQ.Replay] for the whole queue: it holds the replay lease of
// every partition's dead-letter stream (another replay of any of them gives
// [ErrReplayActive]) and moves the matching entries in the queue's order
// (see [Partitioned]), each back to its own partition; ReplayOptions.Limit
// counts the moves of all partitions. Each partition keeps its cursor as a
// DLQ's replay does; they are all kept while the queue's replay is stopped
// (by Limit, a cancellation or a crash) and all deleted when it reaches the
// end of every partition, so the next Replay with the same filter resumes
// each partition where it stopped.
func (p *Partitioned) Replay(ctx context.Context, f Filter, o ReplayOptions) (ReplayResult, error) {
	return replay(ctx, p.parts, f, o)
}

// Purge deletes the entries matching f from every partition, one partition
// after the other, and returns how many it deleted (in a dry run: how many
// match). o.Progress counts across partitions.
func (p *Partitioned) Purge(ctx context.Context, f Filter, o PurgeOptions) (int, error) {
	n := 0
	progress := o.Progress
	for _, d := range p.parts {
		base := n
		if progress != nil {
			o.Progress = func(done int) { progress(base + done) }
		}
		c, err := d.Purge(ctx, f, o)
		n += c
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// merger reads the entries of several dead-letter streams in one order: by
// entry ID, equal IDs in the order of the streams. Each stream is read
// page by page (DLQ.scan) as the merge reaches it.
type merger struct {
	parts []*mergePart
	// skip, if set, is called for each entry that does not match, in its
	// stream's order, when the merge reads past it.
	skip func(i int, e Entry) error
}

type mergePart struct {
	next func() (Entry, bool, bool) // entry, matched, ok
	stop func()
	err  error
	head *Entry // the next matching entry, nil when not read yet
	done bool
}

// newMerger reads n streams: stream i is that of part(i), from start to end
// (XRANGE bounds; end "" for none).
func newMerger(ctx context.Context, f Filter, n int, part func(i int) (d *DLQ, start, end string)) *merger {
	m := &merger{parts: make([]*mergePart, n)}
	for i := range n {
		d, start, end := part(i)
		mp := &mergePart{done: end == ""}
		m.parts[i] = mp
		if mp.done {
			continue
		}
		var seq iter.Seq2[Entry, bool] = func(yield func(Entry, bool) bool) {
			mp.err = d.scan(ctx, f, start, end, func(e Entry, matched bool) (bool, error) { return yield(e, matched), nil })
		}
		mp.next, mp.stop = iter.Pull2(seq)
	}
	return m
}

// peek returns the stream holding the next matching entry and that entry,
// or -1 at the end of every stream.
func (m *merger) peek() (int, Entry, error) {
	best := -1
	for i, mp := range m.parts {
		for mp.head == nil && !mp.done {
			e, matched, ok := mp.next()
			switch {
			case !ok:
				mp.done = true
				if mp.err != nil {
					return -1, Entry{}, mp.err
				}
			case matched:
				mp.head = &e
			case m.skip != nil:
				if err := m.skip(i, e); err != nil {
					return -1, Entry{}, err
				}
			}
		}
		if mp.head != nil && (best < 0 || stream.CompareIDs(mp.head.ID, m.parts[best].head.ID) < 0) {
			best = i
		}
	}
	if best < 0 {
		return -1, Entry{}, nil
	}
	return best, *m.parts[best].head, nil
}

// pop consumes the entry peek returned for stream i.
func (m *merger) pop(i int) { m.parts[i].head = nil }

// close stops reading.
func (m *merger) close() {
	for _, mp := range m.parts {
		if mp.stop != nil {
			mp.stop()
		}
	}
}
