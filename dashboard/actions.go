package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/stream"
)

// Every action is two POSTs: the first (without confirm) counts what the
// action would touch, writing nothing, and shows a confirmation page that
// says how many jobs; the second carries confirm=<that count> and acts.

type confirmData struct {
	Action  string // replay, purge, delete, run, pause, resume
	Button  string // the button's text, when not "<action> <count> job(s)"
	Title   string
	What    string // the sentence stating how many jobs
	Count   int
	Target  string // the form's action path
	Hidden  url.Values
	Back    string
	Rate    float64
	Changed bool
}

// confirmed returns the count the user confirmed, and false on the first
// POST.
func confirmed(r *http.Request) (int, bool) {
	n, err := strconv.Atoi(r.PostForm.Get("confirm"))
	return n, err == nil && n >= 0
}

func (d *Dashboard) redirect(w http.ResponseWriter, r *http.Request, path string, v url.Values) {
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	http.Redirect(w, r, path, http.StatusSeeOther)
}

func (d *Dashboard) replay(w http.ResponseWriter, r *http.Request) {
	t, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	ff, f, q, err := t.filter(r.PostForm)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, "bad filter: "+err.Error(), nil)
		return
	}
	rate := d.cfg.ReplayRate
	if s := r.PostForm.Get("rate"); s != "" {
		if rate, err = strconv.ParseFloat(s, 64); err != nil || !(rate > 0 && rate <= 1e6) { // NaN fails both
			d.fail(w, r, http.StatusBadRequest, "rate must be a number of jobs per second above 0", nil)
			return
		}
	}
	back := link(basePath(r), "queues", t.name, "dead")
	n, yes := confirmed(r)
	if !yes {
		dry, err := q.Replay(r.Context(), f, dlq.ReplayOptions{DryRun: true})
		if err != nil {
			d.fail(w, r, http.StatusBadGateway, "cannot count the dead letters", err)
			return
		}
		to := "stream " + strconv.Quote(t.name)
		if t.part != nil {
			to = "the partitions of queue " + strconv.Quote(t.name) + " they died in"
		}
		what := "Replay " + fmtInt(int64(dry.Replayed)) + " job(s) (" + ff.Describe() + ") back to " + to + " at " + fmtRate(rate) + "?"
		if dry.Resumed {
			what += " This continues an interrupted replay with the same filter."
		}
		what += " Idempotency records are left as they are: a job whose operation completed is acknowledged without running, " +
			"and one that died permanent dies again unless its record is forgotten (pelican dlq replay --forget-failed-idempotency)."
		d.confirm(w, r, confirmData{Action: "replay", Title: "Replay dead letters", What: what, Count: dry.Replayed,
			Target: back + "/replay", Hidden: ff.values(), Back: back + "?" + ff.values().Encode(), Rate: rate})
		return
	}
	if n == 0 {
		d.redirect(w, r, back, url.Values{"done": {"gone"}})
		return
	}
	if err := d.replays.start(d, t.name, q, f, ff, rate, n); err != nil {
		d.fail(w, r, http.StatusConflict, "cannot start the replay", err)
		return
	}
	v := ff.values()
	v.Set("done", "replay")
	d.redirect(w, r, back, v)
}

func (d *Dashboard) purge(w http.ResponseWriter, r *http.Request) {
	t, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	ff, f, q, err := t.filter(r.PostForm)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, "bad filter: "+err.Error(), nil)
		return
	}
	back := link(basePath(r), "queues", t.name, "dead")
	count, err := q.Purge(r.Context(), f, dlq.PurgeOptions{DryRun: true})
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot count the dead letters", err)
		return
	}
	n, yes := confirmed(r)
	if !yes || n != count {
		d.confirm(w, r, confirmData{Action: "purge", Title: "Purge dead letters", Changed: yes,
			What:  "Delete " + fmtInt(int64(count)) + " dead letter(s) (" + ff.Describe() + ") for good? They cannot be replayed afterwards.",
			Count: count, Target: back + "/purge", Hidden: ff.values(), Back: back + "?" + ff.values().Encode()})
		return
	}
	done, err := q.Purge(context.WithoutCancel(r.Context()), f, dlq.PurgeOptions{})
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "purge stopped after "+strconv.Itoa(done)+" entries", err)
		return
	}
	d.redirect(w, r, back, url.Values{"done": {"purge"}, "n": {strconv.Itoa(done)}})
}

func (d *Dashboard) deleteOne(w http.ResponseWriter, r *http.Request) {
	t, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	ref := r.PathValue("id")
	q, id, err := t.one(ref)
	if err != nil {
		d.fail(w, r, http.StatusNotFound, "not an entry ID", nil)
		return
	}
	back := link(basePath(r), "queues", t.name, "dead")
	f := dlq.Filter{IDs: []string{id}}
	if _, yes := confirmed(r); !yes {
		count, err := q.Purge(r.Context(), f, dlq.PurgeOptions{DryRun: true})
		if err != nil {
			d.fail(w, r, http.StatusBadGateway, "cannot read the dead letter", err)
			return
		}
		d.confirm(w, r, confirmData{Action: "delete", Title: "Delete a dead letter", Count: count,
			What:   "Delete " + strconv.Itoa(count) + " dead letter (" + ref + ") for good?",
			Target: back + "/" + url.PathEscape(ref) + "/delete", Back: back + "/" + url.PathEscape(ref)})
		return
	}
	n, err := q.Purge(context.WithoutCancel(r.Context()), f, dlq.PurgeOptions{})
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot delete the dead letter", err)
		return
	}
	d.redirect(w, r, back, url.Values{"done": {"delete"}, "n": {strconv.Itoa(n)}})
}

// runNow makes one delayed job due at once (ZADD XX with the Redis time as
// its score): the consumers' next promotion moves it into the stream, as
// for any due job. A job promoted meanwhile is left alone (XX).
func (d *Dashboard) runNow(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	name := r.PathValue("queue")
	keys, err := stream.KeysFor(name)
	if err != nil {
		d.fail(w, r, http.StatusNotFound, "not a queue name", err)
		return
	}
	back := link(basePath(r), "queues", name)
	key, score := r.PostForm.Get("key"), r.PostForm.Get("score")
	if _, err := strconv.ParseFloat(score, 64); err != nil {
		d.fail(w, r, http.StatusBadRequest, "bad score", nil)
		return
	}
	zs, err := d.rdb.ZRangeByScore(ctx, keys.Delayed, &redis.ZRangeBy{Min: score, Max: score}).Result()
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "ZRANGEBYSCORE "+keys.Delayed, err)
		return
	}
	var members []any
	for _, m := range zs {
		if k, _, err := stream.DecodeDelayed(m); err == nil && k == key {
			members = append(members, m)
		}
	}
	if _, yes := confirmed(r); !yes {
		d.confirm(w, r, confirmData{Action: "run", Title: "Run a delayed job now", Count: len(members),
			What:   "Make " + strconv.Itoa(len(members)) + " delayed job(s) (" + strconv.Quote(key) + ") due now? It runs as soon as a consumer promotes it.",
			Target: back + "/delayed/run", Hidden: url.Values{"key": {key}, "score": {score}}, Back: back})
		return
	}
	if len(members) == 0 {
		d.redirect(w, r, back, url.Values{"done": {"gone"}})
		return
	}
	now, err := d.rdb.Time(ctx).Result()
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "TIME", err)
		return
	}
	zm := make([]redis.Z, len(members))
	for i, m := range members {
		zm[i] = redis.Z{Score: float64(now.UnixMilli()), Member: m}
	}
	n, err := d.rdb.ZAddArgs(ctx, keys.Delayed, redis.ZAddArgs{XX: true, Ch: true, Members: zm}).Result()
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "ZADD "+keys.Delayed, err)
		return
	}
	d.redirect(w, r, back, url.Values{"done": {"run"}, "n": {strconv.FormatInt(n, 10)}})
}

func (d *Dashboard) confirm(w http.ResponseWriter, r *http.Request, c confirmData) {
	d.render(w, r, http.StatusOK, "confirm", c.Title, false, c)
}

// replays are the replays this dashboard runs, one per queue at most (and
// one per dead-letter stream across processes: the dlq package's lease,
// every partition's for a partitioned queue).
type replays struct {
	mu sync.Mutex
	by map[string]*replayView
}

// replayView is a replay's state as the dead-letter page shows it.
type replayView struct {
	Filter   string
	Rate     float64
	Total    int
	Started  time.Time
	Running  bool
	Progress dlq.ReplayProgress
	Result   dlq.ReplayResult
	Err      string
}

func newReplays() *replays { return &replays{by: map[string]*replayView{}} }

func (rs *replays) view(source string) *replayView {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	v, ok := rs.by[source]
	if !ok {
		return nil
	}
	c := *v
	return &c
}

// errReplayRunning is returned when this dashboard already replays the
// queue.
var errReplayRunning = errors.New("a replay of this queue started here is still running")

// start runs a replay of at most limit jobs of q, the dead letters of
// queue name (or some of them: one partition's), in the background.
func (rs *replays) start(d *Dashboard, name string, q deadLetters, f dlq.Filter, ff filterForm, rate float64, limit int) error {
	if d.ctx.Err() != nil {
		return errors.New("the dashboard is closed")
	}
	rs.mu.Lock()
	if v, ok := rs.by[name]; ok && v.Running {
		rs.mu.Unlock()
		return errReplayRunning
	}
	v := &replayView{Filter: ff.Describe(), Rate: rate, Total: limit, Started: time.Now(), Running: true}
	rs.by[name] = v
	rs.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		res, err := q.Replay(d.ctx, f, dlq.ReplayOptions{Rate: rate, Limit: limit, Progress: func(p dlq.ReplayProgress) {
			rs.mu.Lock()
			v.Progress = p
			rs.mu.Unlock()
		}})
		rs.mu.Lock()
		defer rs.mu.Unlock()
		v.Running, v.Result = false, res
		switch {
		case errors.Is(err, dlq.ErrReplayActive):
			v.Err = "another replay of this dead-letter stream is running (elsewhere); try again when it ends"
		case err != nil && d.ctx.Err() != nil:
			v.Err = "stopped: the dashboard was closed; replay again with the same filter to continue"
		case err != nil:
			v.Err = err.Error()
			d.log.Warn("dashboard: replay failed", "stream", name, "error", err)
		}
	}()
	return nil
}
