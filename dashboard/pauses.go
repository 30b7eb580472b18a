package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/stream"
)

// maxPauseFields bounds the pause hash the dashboard reads: Pause keeps at
// most control.MaxPauses live fields, and a hash with many more was not
// written by Pelican; it is reported, not read.
const maxPauseFields = 2 * control.MaxPauses

// maxPauseFor is the longest pause the pause form takes.
const maxPauseFor = 366 * 24 * time.Hour

// pauseItem is one pause: of the whole queue (Type "") or of a job type,
// until a time (zero: until resumed), on Parts of the queue's streams.
type pauseItem struct {
	Type  string
	Shown string // Type, cut at Config.MaxValueBytes
	Until time.Time
	Parts int
	// Resumable is false for a type longer than Pause takes (a field that
	// Pelican did not write): Resume would refuse it.
	Resumable bool
}

// pauseView is what is paused in a queue (every partition's pauses for a
// partitioned one).
type pauseView struct {
	Known   bool   // the pauses could be read
	Err     string // why some could not
	Queue   bool   // the whole queue is paused (on some partition at least)
	Items   []pauseItem
	More    int // pauses not listed (over Config.PageSize)
	Streams int // how many streams the queue has
}

// Types is how many job types are paused.
func (p pauseView) Types() int {
	n := p.More
	for _, it := range p.Items {
		if it.Type != "" {
			n++
		}
	}
	return n
}

// readPauses reads the pauses of each queue (its streams: one, or its
// partitions) at time now of the Redis clock: HLEN of every pause hash in
// one round trip, then HGETALL of those that hold any, in another. A user
// that may not read them (NOPERM) gets Known false.
func (d *Dashboard) readPauses(ctx context.Context, queues [][]string, now time.Time) []pauseView {
	type ref struct{ q, s int }
	var refs []ref
	var keys []string
	for qi, ss := range queues {
		for si, s := range ss {
			k, err := stream.KeysFor(s)
			if err != nil {
				continue
			}
			refs = append(refs, ref{qi, si})
			keys = append(keys, k.Paused)
		}
	}
	out := make([]pauseView, len(queues))
	for i, ss := range queues {
		out[i] = pauseView{Known: true, Streams: len(ss)}
	}
	lens := make([]*redis.IntCmd, len(keys))
	pipe := d.rdb.Pipeline()
	for i, k := range keys {
		lens[i] = pipe.HLen(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	all := make([]*redis.MapStringStringCmd, len(keys))
	pipe = d.rdb.Pipeline()
	queued := 0
	for i, c := range lens {
		v := &out[refs[i].q]
		n, err := c.Result()
		switch {
		case queuestats.NoPerm(err):
			v.Known = false
		case err != nil:
			v.Err = "HLEN " + keys[i] + ": " + err.Error()
		case n > maxPauseFields:
			v.Err = keys[i] + " holds " + fmtInt(n) + " fields, more than Pelican writes: not read"
		case n > 0:
			all[i] = pipe.HGetAll(ctx, keys[i])
			queued++
		}
	}
	if queued > 0 {
		_, _ = pipe.Exec(ctx)
	}
	type key struct {
		typ   string
		until int64
	}
	merged := make([]map[key]int, len(queues))
	for i, c := range all {
		if c == nil {
			continue
		}
		v := &out[refs[i].q]
		m, err := c.Result()
		if err != nil {
			v.Err = "HGETALL " + keys[i] + ": " + err.Error()
			continue
		}
		p := control.ParseState(now, m)
		if merged[refs[i].q] == nil {
			merged[refs[i].q] = map[key]int{}
		}
		if p.Queue {
			merged[refs[i].q][key{"", untilMs(p.QueueUntil)}]++
		}
		for t, u := range p.Types {
			merged[refs[i].q][key{t, untilMs(u)}]++
		}
	}
	for qi, m := range merged {
		v := &out[qi]
		for k, n := range m {
			it := pauseItem{Type: k.typ, Shown: d.clip(k.typ), Parts: n, Resumable: control.ResumeOptions{Type: k.typ}.Validate() == nil}
			if !it.Resumable {
				it.Type = "" // not sent back in a form
			}
			if k.until != 0 {
				it.Until = time.UnixMilli(k.until)
			}
			v.Items = append(v.Items, it)
			v.Queue = v.Queue || k.typ == ""
		}
		sort.Slice(v.Items, func(a, b int) bool {
			x, y := v.Items[a], v.Items[b]
			if x.Type != y.Type {
				return x.Type < y.Type // the queue's ("") first
			}
			return x.Until.Before(y.Until)
		})
		if len(v.Items) > d.cfg.PageSize {
			v.More = len(v.Items) - d.cfg.PageSize
			v.Items = v.Items[:d.cfg.PageSize]
		}
	}
	return out
}

func untilMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// queueStreams returns the streams of the request's queue (its partitions
// for a partitioned one), or writes 404 when it is no queue name or none
// of them exists.
func (d *Dashboard) queueStreams(w http.ResponseWriter, r *http.Request) (string, []string, bool) {
	name := r.PathValue("queue")
	ss := d.partitions(name)
	if ss == nil {
		if _, err := stream.KeysFor(name); err != nil {
			d.fail(w, r, http.StatusNotFound, "not a queue name", err)
			return "", nil, false
		}
		ss = []string{name}
	}
	n, err := d.rdb.Exists(r.Context(), ss...).Result()
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "EXISTS", err)
		return "", nil, false
	}
	if n == 0 {
		d.fail(w, r, http.StatusNotFound, "unknown stream "+strconv.Quote(name), nil)
		return "", nil, false
	}
	return name, ss, true
}

// onStreams says on how many streams an action acts, for a partitioned
// queue.
func onStreams(ss []string) string {
	if len(ss) == 1 {
		return ""
	}
	return " on its " + strconv.Itoa(len(ss)) + " partitions"
}

// pause pauses the queue, or one job type of it, for a while or until
// resumed (control.Pause on each of its streams).
func (d *Dashboard) pause(w http.ResponseWriter, r *http.Request) {
	name, ss, ok := d.queueStreams(w, r)
	if !ok {
		return
	}
	typ, forS := r.PostForm.Get("type"), r.PostForm.Get("for")
	o := control.PauseOptions{Type: typ}
	var dur time.Duration
	if forS != "" {
		var err error
		if dur, err = time.ParseDuration(forS); err != nil || dur <= 0 || dur > maxPauseFor {
			d.fail(w, r, http.StatusBadRequest, "for: a duration such as 10m or 2h, at most 8784h", nil)
			return
		}
		o.Until = time.Now().Add(dur)
	}
	if err := o.Validate(); err != nil {
		d.fail(w, r, http.StatusBadRequest, "bad pause", err)
		return
	}
	back := link(basePath(r), "queues", name)
	if _, yes := confirmed(r); !yes {
		what := "the whole queue " + strconv.Quote(name)
		if typ != "" {
			what = "the jobs of type " + strconv.Quote(d.clip(typ)) + " of queue " + strconv.Quote(name)
		}
		until := "until resumed"
		if dur > 0 {
			until = "for " + fmtDuration(dur)
		}
		d.confirm(w, r, confirmData{Action: "pause", Title: "Pause", Count: len(ss), Button: "Pause",
			What:   "Pause " + what + onStreams(ss) + ", " + until + "? Consumers stop starting such jobs within about a second; running jobs finish.",
			Target: back + "/pause", Hidden: url.Values{"type": {typ}, "for": {forS}}, Back: back})
		return
	}
	ctx := context.WithoutCancel(r.Context())
	for i, s := range ss {
		if err := control.Pause(ctx, d.rdb, s, o); err != nil {
			d.fail(w, r, http.StatusBadGateway, "paused "+strconv.Itoa(i)+" of "+strconv.Itoa(len(ss))+" stream(s), then", err)
			return
		}
	}
	d.redirect(w, r, back, url.Values{"done": {"pause"}, "n": {strconv.Itoa(len(ss))}})
}

// resume lifts a pause of the queue (the whole queue's, a type's, or all:
// control.Resume on each of its streams).
func (d *Dashboard) resume(w http.ResponseWriter, r *http.Request) {
	name, ss, ok := d.queueStreams(w, r)
	if !ok {
		return
	}
	o := control.ResumeOptions{Type: r.PostForm.Get("type"), All: r.PostForm.Get("all") == "1"}
	if err := o.Validate(); err != nil {
		d.fail(w, r, http.StatusBadRequest, "bad resume", err)
		return
	}
	back := link(basePath(r), "queues", name)
	if _, yes := confirmed(r); !yes {
		what := "the pause of the whole queue " + strconv.Quote(name)
		switch {
		case o.All:
			what = "every pause of queue " + strconv.Quote(name)
		case o.Type != "":
			what = "the pause of type " + strconv.Quote(d.clip(o.Type)) + " of queue " + strconv.Quote(name)
		}
		hidden := url.Values{"type": {o.Type}}
		if o.All {
			hidden.Set("all", "1")
		}
		d.confirm(w, r, confirmData{Action: "resume", Title: "Resume", Count: len(ss), Button: "Resume",
			What:   "Lift " + what + onStreams(ss) + "? The jobs it holds start at once.",
			Target: back + "/resume", Hidden: hidden, Back: back})
		return
	}
	ctx := context.WithoutCancel(r.Context())
	lifted := 0
	for _, s := range ss {
		err := control.Resume(ctx, d.rdb, s, o)
		switch {
		case err == nil:
			lifted++
		case !errors.Is(err, control.ErrNotPaused):
			d.fail(w, r, http.StatusBadGateway, "resumed "+strconv.Itoa(lifted)+" stream(s), then", err)
			return
		}
	}
	d.redirect(w, r, back, url.Values{"done": {"resume"}, "n": {strconv.Itoa(lifted)}})
}
