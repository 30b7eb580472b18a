package queuestats

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// DefaultReasonScan is how many of a queue's newest dead letters [Collect]
// counts by reason when Options.ReasonScan is 0.
const DefaultReasonScan = 1000

var (
	//go:embed reasons.lua
	reasonsLua    string
	reasonsScript = redis.NewScript(reasonsLua)
)

// ErrNotFound is a Queue's Err when its stream does not exist.
var ErrNotFound = errors.New("queuestats: unknown stream")

// Options configures [Collect].
type Options struct {
	// ReasonScan is how many of each queue's newest dead letters are
	// counted by reason; negative counts none (the caller counts them
	// itself). Defaults to [DefaultReasonScan].
	ReasonScan int
}

// Queue is the state of one queue (a stream and its derived keys).
type Queue struct {
	Stream string
	// Err is why this queue could not be read: [ErrNotFound], a WRONGTYPE
	// or NOPERM reply (see [NoPerm]), or another Redis error. The other
	// fields are then partial.
	Err         error
	Length      int64
	Delayed     int64
	DeadLetters int64
	// DeadByReason counts the newest DeadScanned dead letters by
	// dead_reason; DeadCapped reports that older ones were not counted.
	DeadByReason map[string]int64
	DeadScanned  int64
	DeadCapped   bool
	// ReasonsErr is why the dead letters could not be counted by reason
	// (a Redis user without EVALSHA: NOPERM); the other fields are whole.
	ReasonsErr error
	// Added is how many entries were ever added to the stream (a group's
	// entries-read plus its lag), or -1 when no group can tell.
	Added  int64
	Groups []Group
}

// Group is one consumer group of a stream.
type Group struct {
	Name            string
	Pending         int64
	Lag             int64 // -1 when Redis cannot tell it
	EntriesRead     int64 // -1 when Redis cannot tell it (then Lag is -1 too)
	LastDeliveredID string
	// OldestPendingID is the group's oldest pending entry ("" when none);
	// OldestPendingAge is its age by its ID's time and OldestPendingIdle
	// the time since its last delivery.
	OldestPendingID   string
	OldestPendingAge  time.Duration
	OldestPendingIdle time.Duration
	Consumers         []Consumer
}

// Settled is how many entries the group read and no longer holds pending
// (acknowledged), or -1 when Redis cannot tell.
func (g Group) Settled() int64 {
	if g.EntriesRead < 0 {
		return -1
	}
	return g.EntriesRead - g.Pending
}

// Consumer is one consumer of a group.
type Consumer struct {
	Name    string
	Pending int64
	Idle    time.Duration
}

// MaxLag is the largest lag of q's groups, or -1 when none can tell it.
func (q Queue) MaxLag() int64 {
	lag := int64(-1)
	for _, g := range q.Groups {
		lag = max(lag, g.Lag)
	}
	return lag
}

// Pending is the sum of q's groups' pending entries.
func (q Queue) Pending() int64 {
	var n int64
	for _, g := range q.Groups {
		n += g.Pending
	}
	return n
}

// Consumers is how many consumers q's groups have.
func (q Queue) Consumers() int {
	n := 0
	for _, g := range q.Groups {
		n += len(g.Consumers)
	}
	return n
}

// OldestPendingAge is the age of q's oldest pending entry, over every
// group, and false when none is pending.
func (q Queue) OldestPendingAge() (time.Duration, bool) {
	var age time.Duration
	found := false
	for _, g := range q.Groups {
		if g.OldestPendingID != "" && (!found || g.OldestPendingAge > age) {
			age, found = g.OldestPendingAge, true
		}
	}
	return age, found
}

// Reasons returns q's dead-letter reasons, sorted.
func (q Queue) Reasons() []string {
	rs := make([]string, 0, len(q.DeadByReason))
	for r := range q.DeadByReason {
		rs = append(rs, r)
	}
	sort.Strings(rs)
	return rs
}

// NoPerm reports whether err is a NOPERM reply: an ACL denied the command
// or one of its keys.
func NoPerm(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "NOPERM")
}

// WrongType reports whether err is a WRONGTYPE reply.
func WrongType(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "WRONGTYPE")
}

type firstTrip struct {
	keys    stream.Keys
	xlen    *redis.IntCmd
	delayed *redis.IntCmd
	dead    *redis.IntCmd
	groups  *redis.XInfoGroupsCmd
	reasons *redis.Cmd
}

// Collect reads the queues named, in two pipelined round trips in all (see
// the package documentation), and returns them in the same order, with the
// Redis server's time. A queue that cannot be read has its Err set; the
// error returned is for what stops every queue (Redis unreachable).
func Collect(ctx context.Context, rdb redis.UniversalClient, names []string, o Options) ([]Queue, time.Time, error) {
	if o.ReasonScan == 0 {
		o.ReasonScan = DefaultReasonScan
	}
	qs := make([]Queue, len(names))
	trips := make([]*firstTrip, len(names))
	var now time.Time
	for attempt := 0; ; attempt++ {
		pipe := rdb.Pipeline()
		tm := pipe.Time(ctx)
		for i, s := range names {
			qs[i] = Queue{Stream: s, DeadByReason: map[string]int64{}, Added: -1}
			keys, err := stream.KeysFor(s)
			if err != nil {
				qs[i].Err = err
				trips[i] = nil
				continue
			}
			ft := &firstTrip{keys: keys}
			ft.xlen = pipe.XLen(ctx, s)
			ft.delayed = pipe.ZCard(ctx, keys.Delayed)
			ft.dead = pipe.XLen(ctx, keys.Dead)
			ft.groups = pipe.XInfoGroups(ctx, s)
			if o.ReasonScan > 0 {
				ft.reasons = reasonsScript.EvalSha(ctx, pipe, []string{keys.Dead}, o.ReasonScan)
			}
			trips[i] = ft
		}
		_, _ = pipe.Exec(ctx)
		if err := tm.Err(); err != nil {
			return nil, time.Time{}, fmt.Errorf("queuestats: redis TIME: %w", err)
		}
		now = tm.Val()
		noScript := false
		for _, ft := range trips {
			if ft != nil && ft.reasons != nil && redis.HasErrorPrefix(ft.reasons.Err(), "NOSCRIPT") {
				noScript = true
			}
		}
		if !noScript || attempt > 0 {
			break
		}
		// Redis lost its script cache (a restart): load and read again.
		if err := loadScript(ctx, rdb); err != nil {
			return nil, time.Time{}, fmt.Errorf("queuestats: load reasons.lua: %w", err)
		}
	}

	// Second trip: each group's oldest pending entry and consumers.
	type groupTrip struct {
		q, g      int
		pending   *redis.XPendingExtCmd
		consumers *redis.XInfoConsumersCmd
	}
	var gts []groupTrip
	pipe := rdb.Pipeline()
	for i, ft := range trips {
		if ft == nil {
			continue
		}
		q := &qs[i]
		q.Err = firstErr(q.Stream, ft)
		if q.Err != nil {
			continue
		}
		q.Length, q.Delayed, q.DeadLetters = ft.xlen.Val(), ft.delayed.Val(), ft.dead.Val()
		var res []any
		var err error = redis.Nil
		if ft.reasons != nil {
			res, err = ft.reasons.Slice()
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			q.ReasonsErr = fmt.Errorf("dead-letter reasons of %s: %w", ft.keys.Dead, err)
		}
		if err == nil && len(res) > 0 {
			q.DeadScanned, _ = res[0].(int64)
			for j := 1; j+1 < len(res); j += 2 {
				r, _ := res[j].(string)
				n, _ := res[j+1].(int64)
				q.DeadByReason[r] = n
			}
			q.DeadCapped = q.DeadScanned < q.DeadLetters
		}
		for _, g := range ft.groups.Val() {
			gr := Group{Name: g.Name, Pending: g.Pending, Lag: g.Lag, EntriesRead: g.EntriesRead, LastDeliveredID: g.LastDeliveredID}
			if g.Lag < 0 {
				gr.Lag = -1
			}
			if gr.Lag < 0 {
				// Redis knows entries-read whenever it knows the lag;
				// go-redis reads an unknown (nil) entries-read as 0.
				gr.EntriesRead = -1
			}
			if gr.Lag >= 0 && gr.EntriesRead >= 0 {
				q.Added = max(q.Added, gr.EntriesRead+gr.Lag)
			}
			q.Groups = append(q.Groups, gr)
			gt := groupTrip{q: i, g: len(q.Groups) - 1}
			if g.Pending > 0 {
				gt.pending = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: q.Stream, Group: g.Name, Start: "-", End: "+", Count: 1})
			}
			gt.consumers = pipe.XInfoConsumers(ctx, q.Stream, g.Name)
			gts = append(gts, gt)
		}
	}
	if len(gts) > 0 {
		_, _ = pipe.Exec(ctx)
	}
	for _, gt := range gts {
		q := &qs[gt.q]
		g := &q.Groups[gt.g]
		if gt.pending != nil {
			p, err := gt.pending.Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				q.Err = fmt.Errorf("XPENDING %s %s: %w", q.Stream, g.Name, err)
				continue
			}
			if len(p) > 0 {
				g.OldestPendingID = p[0].ID
				g.OldestPendingIdle = p[0].Idle
				if t, ok := stream.EntryTime(p[0].ID); ok {
					g.OldestPendingAge = max(now.Sub(t), 0)
				}
			}
		}
		cs, err := gt.consumers.Result()
		if err != nil {
			q.Err = fmt.Errorf("XINFO CONSUMERS %s %s: %w", q.Stream, g.Name, err)
			continue
		}
		for _, c := range cs {
			g.Consumers = append(g.Consumers, Consumer{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
	}
	return qs, now, nil
}

func firstErr(s string, ft *firstTrip) error {
	if err := ft.xlen.Err(); err != nil {
		return fmt.Errorf("XLEN %s: %w", s, err)
	}
	if err := ft.groups.Err(); err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return fmt.Errorf("%w %q", ErrNotFound, s)
		}
		return fmt.Errorf("XINFO GROUPS %s: %w", s, err)
	}
	if err := ft.delayed.Err(); err != nil {
		return fmt.Errorf("ZCARD %s: %w", ft.keys.Delayed, err)
	}
	if err := ft.dead.Err(); err != nil {
		return fmt.Errorf("XLEN %s: %w", ft.keys.Dead, err)
	}
	return nil
}

// loadScript loads reasons.lua on every node (every master of a cluster).
func loadScript(ctx context.Context, rdb redis.UniversalClient) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return reasonsScript.Load(ctx, c).Err()
		})
	}
	return reasonsScript.Load(ctx, rdb).Err()
}

// Scan returns the stream keys of the database (of every master of a
// cluster), sorted, without dead-letter streams (names ending in ":dlq").
// denied reports that a node refused SCAN (NOPERM): its streams are
// missing.
func Scan(ctx context.Context, rdb redis.UniversalClient) (keys []string, denied bool, err error) {
	var mu sync.Mutex
	var deniedAny atomic.Bool
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.ScanType(ctx, 0, "*", 1000, "stream").Iterator()
		for it.Next(ctx) {
			k := it.Val()
			if strings.HasSuffix(k, ":dlq") {
				continue
			}
			mu.Lock()
			keys = append(keys, k)
			mu.Unlock()
		}
		err := it.Err()
		if NoPerm(err) {
			deniedAny.Store(true)
			return nil
		}
		return err
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, rdb)
	}
	if err != nil {
		return nil, false, fmt.Errorf("scan streams: %w", err)
	}
	sort.Strings(keys)
	return keys, deniedAny.Load(), nil
}
