package dashboard

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/stream"
)

func isNotFound(err error) bool { return errors.Is(err, queuestats.ErrNotFound) }

type stuckJob struct {
	ID, Group, Consumer, Type, JobID string
	Idle                             time.Duration
	Deliveries                       int64
}

type delayedJob struct {
	Key, Type, JobID, LastError string
	Attempt                     string
	Score                       string
	Due                         time.Time
	In                          time.Duration
	Malformed                   bool
}

type recentEntry struct {
	ID, Type, JobID, Attempt string
	At                       time.Time
	Fields                   int
}

type queueData struct {
	Q                queuestats.Queue
	Added, Completed chart
	StuckAfter       time.Duration
	Stuck            []stuckJob
	StuckCapped      bool
	Delayed          []delayedJob
	Recent           []recentEntry
	PageSize         int
	Now              time.Time
	Message          string
	Pauses           pauseView
	// Parts is the breakdown of a partitioned queue, nil for a stream.
	Parts []partRow
}

// field returns the value of name in a flat field list.
func field(values map[string]any, name string) string {
	s, _ := values[name].(string)
	return s
}

func (d *Dashboard) queue(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.PathValue("queue")
	ss := d.partitions(name)
	if ss == nil {
		ss = []string{name}
	}
	keys, err := stream.KeysFor(name)
	if err != nil && len(ss) == 1 {
		d.fail(w, r, http.StatusNotFound, "not a queue name", err)
		return
	}
	qs, parts, now, err := d.collect(ctx, []string{name})
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the queue", err)
		return
	}
	q := qs[0]
	if isNotFound(q.Err) {
		d.fail(w, r, http.StatusNotFound, "unknown stream "+strconv.Quote(name), nil)
		return
	}
	if q.Err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the queue", q.Err)
		return
	}
	d.rates.record(q, now)
	data := queueData{Q: q, StuckAfter: d.cfg.StuckAfter, PageSize: d.cfg.PageSize, Now: now, Message: doneMessage(r.URL.Query())}
	data.Added, data.Completed = d.rates.charts(name, now)
	all := [][]string{ss}
	for _, s := range parts[0] {
		all = append(all, []string{s.Stream})
	}
	pauses := d.readPauses(ctx, all, now)
	data.Pauses = pauses[0]
	if parts[0] != nil {
		// A partitioned queue: the breakdown, each partition's page for
		// its stuck, delayed and recent jobs.
		for i, p := range parts[0] {
			data.Parts = append(data.Parts, partRow{Index: i, Q: p, NotFound: isNotFound(p.Err), Pauses: pauses[i+1]})
		}
		d.render(w, r, http.StatusOK, "queue", name, true, data)
		return
	}

	n := int64(d.cfg.PageSize)
	pipe := d.rdb.Pipeline()
	pend := make([]*redis.XPendingExtCmd, len(q.Groups))
	for i, g := range q.Groups {
		if g.Pending > 0 {
			pend[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: name, Group: g.Name, Idle: d.cfg.StuckAfter,
				Start: "-", End: "+", Count: n})
		}
	}
	delayed := pipe.ZRangeWithScores(ctx, keys.Delayed, 0, n-1)
	recent := pipe.XRevRangeN(ctx, name, "+", "-", 20)
	_, _ = pipe.Exec(ctx)
	for i, c := range pend {
		if c == nil {
			continue
		}
		ps, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			d.fail(w, r, http.StatusBadGateway, "XPENDING", err)
			return
		}
		for _, p := range ps {
			if len(data.Stuck) == d.cfg.PageSize {
				data.StuckCapped = true
				break
			}
			data.Stuck = append(data.Stuck, stuckJob{ID: p.ID, Group: q.Groups[i].Name, Consumer: p.Consumer, Idle: p.Idle, Deliveries: p.RetryCount})
		}
		if int64(len(ps)) == n {
			data.StuckCapped = true
		}
	}
	// The stuck jobs' types, in one more round trip.
	if len(data.Stuck) > 0 {
		pipe := d.rdb.Pipeline()
		cmds := make([]*redis.XMessageSliceCmd, len(data.Stuck))
		for i, s := range data.Stuck {
			cmds[i] = pipe.XRangeN(ctx, name, s.ID, s.ID, 1)
		}
		_, _ = pipe.Exec(ctx)
		for i, c := range cmds {
			if ms, err := c.Result(); err == nil && len(ms) == 1 {
				data.Stuck[i].Type = d.clip(field(ms[0].Values, stream.FieldType))
				data.Stuck[i].JobID = field(ms[0].Values, stream.FieldJobID)
			} else if err == nil {
				data.Stuck[i].Type = "(entry deleted)"
			}
		}
	}
	zs, err := delayed.Result()
	if err != nil && !queuestats.WrongType(err) {
		d.fail(w, r, http.StatusBadGateway, "ZRANGE "+keys.Delayed, err)
		return
	}
	for _, z := range zs {
		member, _ := z.Member.(string)
		dj := delayedJob{Score: strconv.FormatFloat(z.Score, 'f', -1, 64), Due: time.UnixMilli(int64(z.Score))}
		dj.In = dj.Due.Sub(now)
		key, fields, err := stream.DecodeDelayed(member)
		if err != nil {
			dj.Malformed = true
		} else {
			dj.Key = key
			for i := 0; i+1 < len(fields); i += 2 {
				switch fields[i] {
				case stream.FieldType:
					dj.Type = d.clip(fields[i+1])
				case stream.FieldJobID:
					dj.JobID = fields[i+1]
				case stream.FieldAttempt:
					dj.Attempt = fields[i+1]
				case stream.FieldLastError:
					dj.LastError = fields[i+1]
				}
			}
		}
		data.Delayed = append(data.Delayed, dj)
	}
	ms, err := recent.Result()
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "XREVRANGE "+name, err)
		return
	}
	for _, m := range ms {
		e := recentEntry{ID: m.ID, Type: d.clip(field(m.Values, stream.FieldType)), JobID: d.clip(field(m.Values, stream.FieldJobID)),
			Attempt: field(m.Values, stream.FieldAttempt), Fields: len(m.Values)}
		e.At, _ = stream.EntryTime(m.ID)
		data.Recent = append(data.Recent, e)
	}
	d.render(w, r, http.StatusOK, "queue", name, true, data)
}
