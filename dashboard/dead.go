package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/stream"
)

// filterForm is the dead-letter filter as the page's form sends it (query
// or POST fields): type, reason, since, until, error.
type filterForm struct {
	Type, Reason, Since, Until, Error string
	// ID selects one dead letter (the job view's replay): its ID, or its
	// position <ID>@<partition> in a partitioned queue (deadTarget.one).
	ID string
}

// timeLayouts are accepted for since and until, in UTC unless they say
// otherwise.
var timeLayouts = []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, strings.TrimSpace(s), time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: %q is not a time (use 2006-01-02T15:04, UTC)", field, s)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func readFilter(v url.Values) (filterForm, dlq.Filter, error) {
	ff := filterForm{Type: v.Get("type"), Reason: v.Get("reason"), Since: v.Get("since"), Until: v.Get("until"), Error: v.Get("error"), ID: v.Get("id")}
	f := dlq.Filter{Types: splitList(ff.Type), Reasons: splitList(ff.Reason), ErrorContains: ff.Error}
	var err error
	if ff.Since != "" {
		if f.Since, err = parseTime("since", ff.Since); err != nil {
			return ff, f, err
		}
	}
	if ff.Until != "" {
		if f.Until, err = parseTime("until", ff.Until); err != nil {
			return ff, f, err
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return ff, f, errors.New("since must be before until")
	}
	return ff, f, nil
}

// values returns the filter as form values, for links and hidden fields.
func (ff filterForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": ff.Type, "reason": ff.Reason, "since": ff.Since, "until": ff.Until, "error": ff.Error, "id": ff.ID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Describe says in words what the filter selects.
func (ff filterForm) Describe() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+strconv.Quote(v))
		}
	}
	add("entry", ff.ID)
	add("type", ff.Type)
	add("reason", ff.Reason)
	add("dead since", ff.Since)
	add("dead before", ff.Until)
	add("error containing", ff.Error)
	if len(parts) == 0 {
		return "all dead letters"
	}
	return "dead letters with " + strings.Join(parts, ", ")
}

type deadRow struct {
	ID, Type, JobID, Reason, Error string
	Ref                            string // the entry in URLs (see deadTarget.ref)
	Partition                      int    // -1 for a stream
	DeadAt                         time.Time
	Attempts                       int
}

type deadData struct {
	Stream     string
	DeadStream string
	Total      int64
	Filter     filterForm
	FilterErr  string
	Query      url.Values
	Rows       []deadRow
	Next       string
	After      string
	Replay     *replayView
	Message    string
	ReplayRate float64
	Partitions int // partition count of a partitioned queue
}

// deadLetters are the dead-letter operations the pages use: those of a
// stream (*dlq.DLQ) or of a partitioned queue (*dlq.Partitioned).
type deadLetters interface {
	List(ctx context.Context, f dlq.Filter, limit int, after string) ([]dlq.Entry, string, error)
	Get(ctx context.Context, id string) (dlq.Entry, error)
	Replay(ctx context.Context, f dlq.Filter, o dlq.ReplayOptions) (dlq.ReplayResult, error)
	Purge(ctx context.Context, f dlq.Filter, o dlq.PurgeOptions) (int, error)
}

// deadTarget is the dead letters of the request's queue.
type deadTarget struct {
	name  string      // the queue
	where string      // the dead-letter stream(s), in words
	all   deadLetters // every dead letter of the queue
	part  *dlq.Partitioned
	total int64
}

// ref returns how URLs name e: its ID, or for a partitioned queue its
// position <ID>@<partition> (IDs repeat across partitions).
func (t *deadTarget) ref(e dlq.Entry) (ref string, part int) {
	if t.part == nil {
		return e.ID, -1
	}
	for i, d := range t.part.Partitions() {
		if d.Stream() == e.Stream {
			return dlq.Position(e.ID, i), i
		}
	}
	return e.ID, -1
}

// one returns the dead letters that hold the entry ref names (see ref)
// and its ID.
func (t *deadTarget) one(ref string) (deadLetters, string, error) {
	if t.part == nil {
		_, err := stream.ParseID(ref)
		return t.all, ref, err
	}
	id, i, err := dlq.ParsePosition(ref)
	if err != nil {
		return nil, "", err
	}
	ps := t.part.Partitions()
	if i >= len(ps) {
		return nil, "", fmt.Errorf("position %q: partition %d of a queue of %d", ref, i, len(ps))
	}
	return ps[i], id, nil
}

// filter reads the filter of v: with an id (one entry), it applies to the
// dead letters that hold it only.
func (t *deadTarget) filter(v url.Values) (filterForm, dlq.Filter, deadLetters, error) {
	ff, f, err := readFilter(v)
	if err != nil || ff.ID == "" {
		return ff, f, t.all, err
	}
	dl, id, err := t.one(ff.ID)
	if err != nil {
		return ff, f, nil, fmt.Errorf("id: %w", err)
	}
	f.IDs = []string{id}
	return ff, f, dl, nil
}

// checkAfter reports whether after is a List cursor of the target.
func (t *deadTarget) checkAfter(after string) error {
	if t.part == nil {
		_, err := stream.ParseID(after)
		return err
	}
	_, _, err := dlq.ParsePosition(after)
	return err
}

// deadQueue returns the dead letters of the request's queue (every
// partition's, for a queue of Config.Partitions), or writes 404 when
// neither its stream(s) nor its dead-letter stream(s) exist.
func (d *Dashboard) deadQueue(w http.ResponseWriter, r *http.Request) (*deadTarget, bool) {
	name := r.PathValue("queue")
	t := &deadTarget{name: name}
	var dls []*dlq.DLQ
	if ps := d.partitions(name); ps != nil {
		p, err := dlq.NewPartitioned(d.rdb, name, len(ps), dlq.Config{})
		if err != nil {
			d.fail(w, r, http.StatusNotFound, "not a queue name", err)
			return nil, false
		}
		t.all, t.part, dls = p, p, p.Partitions()
		t.where = "the dead-letter streams of its " + strconv.Itoa(len(ps)) + " partitions"
	} else {
		q, err := dlq.New(d.rdb, name, dlq.Config{})
		if err != nil {
			d.fail(w, r, http.StatusNotFound, "not a queue name", err)
			return nil, false
		}
		t.all, dls, t.where = q, []*dlq.DLQ{q}, q.Stream()
	}
	ctx := r.Context()
	pipe := d.rdb.Pipeline()
	typs := make([]*redis.StatusCmd, len(dls))
	lens := make([]*redis.IntCmd, len(dls))
	for i, q := range dls {
		typs[i] = pipe.Type(ctx, q.Source())
		lens[i] = pipe.XLen(ctx, q.Stream())
	}
	_, _ = pipe.Exec(ctx)
	exists := false
	for i, q := range dls {
		if err := typs[i].Err(); err != nil {
			d.fail(w, r, http.StatusBadGateway, "TYPE", err)
			return nil, false
		}
		if err := lens[i].Err(); err != nil {
			d.fail(w, r, http.StatusBadGateway, "XLEN "+q.Stream(), err)
			return nil, false
		}
		t.total += lens[i].Val()
		exists = exists || typs[i].Val() != "none" || lens[i].Val() > 0
	}
	if !exists {
		d.fail(w, r, http.StatusNotFound, "unknown stream "+strconv.Quote(name), nil)
		return nil, false
	}
	return t, true
}

// messages shown after an action, chosen by the done parameter.
var doneMessages = map[string]string{
	"replay":  "Replay started.",
	"purge":   "Purged %s dead letter(s).",
	"delete":  "Deleted %s dead letter(s).",
	"run":     "%s delayed job(s) made due now; a consumer will promote them at its next promotion.",
	"gone":    "Nothing to do: the job was no longer there.",
	"pause":   "Paused (%s stream(s)): consumers stop starting the jobs within about a second; running jobs finish.",
	"resume":  "Lifted the pause on %s stream(s): the jobs it held start at once.",
	"changed": "The number of matching entries changed since the confirmation; nothing was done.",
}

func doneMessage(v url.Values) string {
	msg, ok := doneMessages[v.Get("done")]
	if !ok {
		return ""
	}
	if strings.Contains(msg, "%s") {
		n, _ := strconv.Atoi(v.Get("n"))
		return fmt.Sprintf(msg, fmtInt(int64(n)))
	}
	return msg
}

func (d *Dashboard) deadList(w http.ResponseWriter, r *http.Request) {
	t, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	v := r.URL.Query()
	ff, f, dl, err := t.filter(v)
	data := deadData{Stream: t.name, DeadStream: t.where, Total: t.total, Filter: ff, Query: ff.values(),
		After: v.Get("after"), Message: doneMessage(v), ReplayRate: d.cfg.ReplayRate}
	if t.part != nil {
		data.Partitions = len(t.part.Partitions())
	}
	data.Replay = d.replays.view(t.name)
	if err != nil {
		data.FilterErr = err.Error()
		d.render(w, r, http.StatusBadRequest, "dead", "Dead letters of "+t.name, false, data)
		return
	}
	if data.After != "" {
		if err := t.checkAfter(data.After); err != nil {
			data.FilterErr = "after: " + err.Error()
			d.render(w, r, http.StatusBadRequest, "dead", "Dead letters of "+t.name, false, data)
			return
		}
	}
	if dl != t.all {
		data.After = "" // one entry of a partition: no paging
	}
	es, next, err := dl.List(r.Context(), f, d.cfg.PageSize, data.After)
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot list the dead letters", err)
		return
	}
	if dl == t.all {
		data.Next = next
	}
	for _, e := range es {
		row := deadRow{ID: e.ID, Type: d.clip(e.Type()), Reason: e.Reason, Error: d.clip(e.Error), DeadAt: e.DeadAt, Attempts: e.Attempts}
		row.Ref, row.Partition = t.ref(e)
		row.JobID, _ = e.Value(stream.FieldJobID)
		data.Rows = append(data.Rows, row)
	}
	d.render(w, r, http.StatusOK, "dead", "Dead letters of "+t.name, data.Replay != nil && data.Replay.Running, data)
}

type fieldView struct {
	Name  string
	Value shown
}

type entryData struct {
	Stream       string
	Entry        *dlq.Entry
	Fields       []fieldView
	Payload      shown
	PayloadKind  string
	DecodeErr    string
	ErrorHistory []string
	Ref          string // the entry in URLs
	Partition    int    // -1 for a stream
	TraceID      string
	TraceLink    string
	// Type and Error are the entry's, cut at MaxValueBytes.
	Type, Error string
}

var traceIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

// traceID returns the trace ID of a W3C traceparent, "" if it has none.
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) < 4 || !traceIDRe.MatchString(parts[1]) || parts[1] == strings.Repeat("0", 32) {
		return ""
	}
	return parts[1]
}

func (d *Dashboard) deadEntry(w http.ResponseWriter, r *http.Request) {
	t, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	ref := r.PathValue("id")
	dl, id, err := t.one(ref)
	if err != nil {
		d.fail(w, r, http.StatusNotFound, "not an entry ID", nil)
		return
	}
	e, err := dl.Get(r.Context(), id)
	if errors.Is(err, dlq.ErrNotFound) {
		d.fail(w, r, http.StatusNotFound, "no dead letter "+ref+" in "+t.where, nil)
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the dead letter", err)
		return
	}
	data := entryData{Stream: t.name, Entry: &e, Type: d.clip(e.Type()), Error: d.clip(e.Error)}
	data.Ref, data.Partition = t.ref(e)
	for _, f := range e.Fields {
		data.Fields = append(data.Fields, fieldView{Name: f.Name, Value: showValue([]byte(f.Value), d.cfg.MaxValueBytes)})
	}
	if e.Job != nil {
		data.Payload, data.PayloadKind = decodePayload(e.Job.Payload, e.Job.ContentType, d.cfg.MaxValueBytes)
		for _, h := range e.Job.ErrorHistory {
			data.ErrorHistory = append(data.ErrorHistory, d.clip(h))
		}
		data.TraceID = traceID(e.Job.TraceParent)
	} else {
		data.DecodeErr = e.DecodeErr.Error()
	}
	if data.TraceID != "" && d.cfg.TraceURL != "" {
		data.TraceLink = strings.ReplaceAll(d.cfg.TraceURL, "{trace_id}", data.TraceID)
	}
	d.render(w, r, http.StatusOK, "entry", "Dead letter "+ref, false, data)
}

// clip cuts a value a producer controls (a job type, an error text) at
// Config.MaxValueBytes, marking the cut with the value's size.
func (d *Dashboard) clip(s string) string {
	t, cutShort := cut(s, d.cfg.MaxValueBytes)
	if !cutShort {
		return s
	}
	return t + " …(cut: " + fmtBytes(len(s)) + ")"
}
