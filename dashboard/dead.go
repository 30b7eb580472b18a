package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/stream"
)

// filterForm is the dead-letter filter as the page's form sends it (query
// or POST fields): type, reason, since, until, error.
type filterForm struct {
	Type, Reason, Since, Until, Error string
	// ID selects one dead letter (the job view's replay).
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
	if ff.ID != "" {
		if _, err := stream.ParseID(ff.ID); err != nil {
			return ff, f, fmt.Errorf("id: %w", err)
		}
		f.IDs = []string{ff.ID}
	}
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
}

// deadQueue returns the DLQ of the request's queue, or writes 404 when
// neither the stream nor its dead-letter stream exists.
func (d *Dashboard) deadQueue(w http.ResponseWriter, r *http.Request) (*dlq.DLQ, int64, bool) {
	name := r.PathValue("queue")
	q, err := dlq.New(d.rdb, name, dlq.Config{})
	if err != nil {
		d.fail(w, r, http.StatusNotFound, "not a queue name", err)
		return nil, 0, false
	}
	ctx := r.Context()
	pipe := d.rdb.Pipeline()
	typ := pipe.Type(ctx, name)
	n := pipe.XLen(ctx, q.Stream())
	_, _ = pipe.Exec(ctx)
	if err := typ.Err(); err != nil {
		d.fail(w, r, http.StatusBadGateway, "TYPE", err)
		return nil, 0, false
	}
	if err := n.Err(); err != nil {
		d.fail(w, r, http.StatusBadGateway, "XLEN "+q.Stream(), err)
		return nil, 0, false
	}
	if typ.Val() == "none" && n.Val() == 0 {
		d.fail(w, r, http.StatusNotFound, "unknown stream "+strconv.Quote(name), nil)
		return nil, 0, false
	}
	return q, n.Val(), true
}

// messages shown after an action, chosen by the done parameter.
var doneMessages = map[string]string{
	"replay":  "Replay started.",
	"purge":   "Purged %s dead letter(s).",
	"delete":  "Deleted %s dead letter(s).",
	"run":     "%s delayed job(s) made due now; a consumer will promote them at its next promotion.",
	"gone":    "Nothing to do: the job was no longer there.",
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
	q, total, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	v := r.URL.Query()
	ff, f, err := readFilter(v)
	data := deadData{Stream: q.Source(), DeadStream: q.Stream(), Total: total, Filter: ff, Query: ff.values(),
		After: v.Get("after"), Message: doneMessage(v), ReplayRate: d.cfg.ReplayRate}
	data.Replay = d.replays.view(q.Source())
	if err != nil {
		data.FilterErr = err.Error()
		d.render(w, r, http.StatusBadRequest, "dead", "Dead letters of "+q.Source(), false, data)
		return
	}
	if data.After != "" {
		if _, err := stream.ParseID(data.After); err != nil {
			data.FilterErr = "after: " + err.Error()
			d.render(w, r, http.StatusBadRequest, "dead", "Dead letters of "+q.Source(), false, data)
			return
		}
	}
	es, next, err := q.List(r.Context(), f, d.cfg.PageSize, data.After)
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot list the dead letters", err)
		return
	}
	data.Next = next
	for _, e := range es {
		row := deadRow{ID: e.ID, Type: d.clip(e.Type()), Reason: e.Reason, Error: d.clip(e.Error), DeadAt: e.DeadAt, Attempts: e.Attempts}
		row.JobID, _ = e.Value(stream.FieldJobID)
		data.Rows = append(data.Rows, row)
	}
	d.render(w, r, http.StatusOK, "dead", "Dead letters of "+q.Source(), data.Replay != nil && data.Replay.Running, data)
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
	q, _, ok := d.deadQueue(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if _, err := stream.ParseID(id); err != nil {
		d.fail(w, r, http.StatusNotFound, "not an entry ID", nil)
		return
	}
	e, err := q.Get(r.Context(), id)
	if errors.Is(err, dlq.ErrNotFound) {
		d.fail(w, r, http.StatusNotFound, "no dead letter "+id+" in "+q.Stream(), nil)
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusBadGateway, "cannot read the dead letter", err)
		return
	}
	data := entryData{Stream: q.Source(), Entry: &e, Type: d.clip(e.Type()), Error: d.clip(e.Error)}
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
	d.render(w, r, http.StatusOK, "entry", "Dead letter "+id, false, data)
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
