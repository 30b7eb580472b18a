package integration

// Outside attack on the decoder's treatment of duplicate field names
// (docs/wire-format.md, "Malformed entries" and "Dead-letter entries"),
// written from the documentation only. Every hostile entry is written with a
// raw XADD, as redis-cli would, and read by a real consumer over each of its
// read paths (a blocking read when idle, a raw read while a backlog keeps the
// reads full, a reclaim after the visibility timeout, a re-read of its own
// pending entries after a restart, and a Pool's shared read of two
// streams, idle and backlogged), on RESP2 and RESP3 clients. A go-redis hook
// on the consumer's client records which read delivered each entry, so that
// a scenario whose read path was not exercised is run again.
//
// The replay tests follow a job written by XADD alone through a dead letter
// and dlq.Replay to its next run (docs/wire-format.md, "Dead-letter
// entries").

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// ---------------------------------------------------------------------------
// Observing which read delivered an entry: a go-redis hook on the consumer's
// client. It looks only at the commands and their replies.

var a30IDPattern = regexp.MustCompile(`^[0-9]+-[0-9]+$`)

// a30Reads records, for each entry ID, the read paths that delivered it:
// "block" (a typed XREADGROUP with BLOCK), "raw" (an XREADGROUP whose reply
// the consumer parses itself), "pending" (a re-read of the consumer's own
// pending entries), "claim" (a reclaim of entries idle past the visibility
// timeout), or "other:<what>".
type a30Reads struct {
	mu    sync.Mutex
	paths map[string][]string
	odd   []string // replies the hook could not classify
}

func newA30Reads() *a30Reads { return &a30Reads{paths: map[string][]string{}} }

func (h *a30Reads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *a30Reads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.observe(cmd)
		return err
	}
}

func (h *a30Reads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.observe(c)
		}
		return err
	}
}

func (h *a30Reads) record(path string, ids []string) {
	if len(ids) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		h.paths[id] = append(h.paths[id], path)
	}
}

func (h *a30Reads) of(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.paths[id])
}

func (h *a30Reads) observe(cmd redis.Cmder) {
	if cmd.Err() != nil {
		return
	}
	name := strings.ToLower(cmd.Name())
	args := cmd.Args()
	switch name {
	case "xreadgroup":
		block := false
		for _, a := range args {
			if s, ok := a.(string); ok && strings.EqualFold(s, "block") {
				block = true
			}
		}
		last := fmt.Sprint(args[len(args)-1])
		var ids []string
		path := ""
		switch c := cmd.(type) {
		case *redis.XStreamSliceCmd:
			for _, s := range c.Val() {
				for _, m := range s.Messages {
					ids = append(ids, m.ID)
				}
			}
			path = "block"
			if !block {
				path = "typed-noblock"
			}
		case *redis.RawCmd:
			v, _, err := a30ParseRESP(c.Val())
			if err != nil {
				h.mu.Lock()
				h.odd = append(h.odd, "unparsable raw reply: "+err.Error())
				h.mu.Unlock()
				return
			}
			a30Entries(v, &ids)
			path = "raw"
		case *redis.Cmd:
			a30Entries(c.Val(), &ids)
			path = "do"
		default:
			h.mu.Lock()
			h.odd = append(h.odd, fmt.Sprintf("xreadgroup reply of type %T", cmd))
			h.mu.Unlock()
			return
		}
		if last != ">" {
			path = "pending"
		}
		// A read of several streams at once (a Pool's shared read).
		for i, a := range args {
			if s, ok := a.(string); ok && strings.EqualFold(s, "streams") && (len(args)-i-1)/2 >= 2 {
				path += "-multi"
				break
			}
		}
		h.record(path, ids)
	case "xautoclaim", "xclaim":
		var ids []string
		switch c := cmd.(type) {
		case *redis.XAutoClaimCmd:
			msgs, _ := c.Val()
			for _, m := range msgs {
				ids = append(ids, m.ID)
			}
		case *redis.XMessageSliceCmd:
			for _, m := range c.Val() {
				ids = append(ids, m.ID)
			}
		case *redis.Cmd:
			a30Entries(c.Val(), &ids)
		}
		h.record("claim", ids)
	case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall":
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return
		}
		arr, ok := c.Val().([]any)
		if !ok || len(arr) == 0 {
			return
		}
		// Observed reply shapes: a reclaim answers [cursor, entries,
		// deleted]; a re-read of the consumer's own pending entries
		// answers [entries, ...]; an entry is [id, fields, ...].
		var ids []string
		switch first := arr[0].(type) {
		case string:
			if a30IDPattern.MatchString(first) && len(arr) >= 2 {
				a30Entries(arr[1], &ids)
				h.record("claim", ids)
				return
			}
		case []any:
			a30Entries(first, &ids)
			h.record("pending", ids)
			return
		}
		a30Entries(arr, &ids)
		h.record("other:script", ids)
	}
}

// a30Entries collects the IDs of the stream entries ([id, [fields...], ...])
// anywhere in a reply.
func a30Entries(v any, out *[]string) {
	switch x := v.(type) {
	case []any:
		if len(x) >= 2 {
			if id, ok := x[0].(string); ok && a30IDPattern.MatchString(id) {
				if _, ok := x[1].([]any); ok {
					*out = append(*out, id)
					return
				}
			}
		}
		for _, e := range x {
			a30Entries(e, out)
		}
	case map[any]any:
		for _, e := range x {
			a30Entries(e, out)
		}
	case map[string]any:
		for _, e := range x {
			a30Entries(e, out)
		}
	}
}

// a30ParseRESP parses one RESP2 or RESP3 reply: aggregates become []any
// (a map's keys and values in turn), strings string, numbers their text.
func a30ParseRESP(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, errors.New("short reply")
	}
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return nil, nil, errors.New("no CRLF")
	}
	typ, line, rest := b[0], string(b[1:i]), b[i+2:]
	switch typ {
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(line)
		if err != nil {
			return nil, nil, err
		}
		if n < 0 {
			return nil, rest, nil
		}
		if typ == '%' || typ == '|' {
			n *= 2
		}
		out := make([]any, 0, n)
		for range n {
			var v any
			if v, rest, err = a30ParseRESP(rest); err != nil {
				return nil, nil, err
			}
			out = append(out, v)
		}
		if typ == '|' { // an attribute precedes the real reply
			return a30ParseRESP(rest)
		}
		return out, rest, nil
	case '$', '=', '!':
		n, err := strconv.Atoi(line)
		if err != nil {
			return nil, nil, err
		}
		if n < 0 {
			return nil, rest, nil
		}
		if len(rest) < n+2 {
			return nil, nil, errors.New("short bulk")
		}
		s := string(rest[:n])
		if typ == '=' && len(s) >= 4 {
			s = s[4:]
		}
		return s, rest[n+2:], nil
	case '+', '-', ':', ',', '(', '#':
		return line, rest, nil
	case '_':
		return nil, rest, nil
	}
	return nil, nil, fmt.Errorf("unknown RESP type %q", typ)
}

// ---------------------------------------------------------------------------
// Entries and what the documentation says of them.

const a30MaxBytes = 20000 // consumer.Config.MaxEntryBytes in the matrix

type a30Verdict int

const (
	a30Runs      a30Verdict = iota // valid: runs once
	a30Malformed                   // malformed, not oversize: copied from the stream
	a30Oversize                    // over the size limit: recorded from what was read
)

type a30Entry struct {
	label  string
	fields []string
	want   a30Verdict
	check  func(j *stream.Job) string // for a30Runs: "" when the job is as expected
}

// a30Last returns the last value of each name: what the decoder sees.
func a30Last(fields []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i]] = fields[i+1]
	}
	return m
}

// a30Counted is the entry's size as the documentation counts it: the
// names and last values of the distinct names.
func a30Counted(fields []string) int {
	n := 0
	for k, v := range a30Last(fields) {
		n += len(k) + len(v)
	}
	return n
}

func a30Raw(fields []string) int {
	n := 0
	for _, f := range fields {
		n += len(f)
	}
	return n
}

func a30Cut(s string) string {
	if len(s) > 1024 {
		return s[:1024]
	}
	return s
}

// a30RawShape: the fields in the stream's order, duplicates kept, values cut.
func a30RawShape(fields []string) []string {
	out := slices.Clone(fields)
	for i := 1; i < len(out); i += 2 {
		out[i] = a30Cut(out[i])
	}
	return out
}

// a30MergedShape: one field per name (its last value), in name order, cut.
func a30MergedShape(fields []string) []string {
	last := a30Last(fields)
	names := make([]string, 0, len(last))
	for k := range last {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []string
	for _, k := range names {
		out = append(out, k, a30Cut(last[k]))
	}
	return out
}

func a30Headers(prefix string, n int, value func(i int) string) []string {
	var f []string
	for i := range n {
		f = append(f, fmt.Sprintf("%s%04d", prefix, i), value(i))
	}
	return f
}

func a30Const(v string) func(int) string { return func(int) string { return v } }

func a30Any(fields []string) []any {
	out := make([]any, len(fields))
	for i, f := range fields {
		out[i] = f
	}
	return out
}

func a30Cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// a30Matrix returns the hostile entries of the read-path matrix.
func a30Matrix() []a30Entry {
	jid := func(l string) string { return "J-" + l }
	var es []a30Entry
	add := func(label string, want a30Verdict, check func(j *stream.Job) string, fields ...[]string) {
		es = append(es, a30Entry{label: label, fields: a30Cat(fields...), want: want, check: check})
	}
	headersAll := func(n int, v string) func(j *stream.Job) string {
		return func(j *stream.Job) string {
			if len(j.Headers) != n {
				return fmt.Sprintf("%d headers, want %d", len(j.Headers), n)
			}
			for k, got := range j.Headers {
				if got != v {
					return fmt.Sprintf("header %s = %q, want the last value %q", k, got, v)
				}
			}
			return ""
		}
	}

	// 1,000 distinct headers, each given twice: at the field limit only if
	// duplicates count once. 2,003 fields in the stream.
	add("hdr1000x2", a30Runs, headersAll(1000, "b"),
		[]string{"type", "t", "job_id", jid("hdr1000x2"), "payload", "{}"},
		a30Headers("h.k", 1000, a30Const("a")), a30Headers("h.k", 1000, a30Const("b")))
	// 500 headers and 500 unknown fields, each given three times, and the
	// format's own fields given again: 1,000 distinct, 3,000+ in all.
	{
		var f []string
		f = append(f, "type", "first", "payload", "p1")
		for r, v := range []string{"a", "b", "c"} {
			for i := range 500 {
				f = append(f, fmt.Sprintf("h.m%03d", i), v, fmt.Sprintf("u%03d", i), v)
			}
			if r == 1 {
				f = append(f, "type", "t", "job_id", jid("mix1000"))
			}
		}
		f = append(f, "payload", "p2")
		add("mix1000", a30Runs, func(j *stream.Job) string {
			if j.Type != "t" || string(j.Payload) != "p2" || len(j.Headers) != 500 || len(j.Extra) != 500 ||
				j.Headers["m000"] != "c" || j.Extra["u499"] != "c" {
				return fmt.Sprintf("type %q payload %q, %d headers (m000 %q), %d extra (u499 %q); want t, p2, 500 and 500, last values c",
					j.Type, j.Payload, len(j.Headers), j.Headers["m000"], len(j.Extra), j.Extra["u499"])
			}
			return ""
		}, f)
	}
	// One header given 3,000 times: 1 distinct field; 33 KB in the stream,
	// over the size limit only if duplicates counted.
	add("hdrRepeat", a30Runs, func(j *stream.Job) string {
		if len(j.Headers) != 1 || j.Headers["same"] != "v2999" || len(j.Extra) != 0 {
			return fmt.Sprintf("headers %d (same=%q), extra %d; want same=v2999 only", len(j.Headers), j.Headers["same"], len(j.Extra))
		}
		return ""
	}, []string{"type", "t", "job_id", jid("hdrRepeat"), "payload", "{}"},
		func() []string {
			var f []string
			for i := range 3000 {
				f = append(f, "h.same", "v"+strconv.Itoa(i))
			}
			return f
		}())
	// 1,001 distinct headers: over the field limit.
	add("hdr1001", a30Malformed, nil,
		[]string{"type", "t", "job_id", jid("hdr1001"), "payload", "{}"},
		a30Headers("h.k", 1001, a30Const("a")))
	// 1,001 distinct headers each given twice: over the limit, 2,005 fields
	// (more than a dead letter copies).
	add("hdr1001x2", a30Malformed, nil,
		[]string{"type", "t", "job_id", jid("hdr1001x2"), "payload", "{}"},
		a30Headers("h.k", 1001, a30Const("a")), a30Headers("h.k", 1001, a30Const("b")))
	// 999 distinct headers, one of them given 200 more times, plus 1
	// unknown field: 1,000 distinct.
	add("hdr999+unk", a30Runs, func(j *stream.Job) string {
		if len(j.Headers) != 999 || len(j.Extra) != 1 || j.Headers["k0500"] != "z199" {
			return fmt.Sprintf("%d headers (k0500=%q), %d extra; want 999 (k0500=z199) and 1", len(j.Headers), j.Headers["k0500"], len(j.Extra))
		}
		return ""
	}, []string{"type", "t", "job_id", jid("hdr999+unk"), "payload", "{}", "origin", "x"},
		a30Headers("h.k", 999, a30Const("a")),
		func() []string {
			var f []string
			for i := range 200 {
				f = append(f, "h.k0500", "z"+strconv.Itoa(i))
			}
			return f
		}())
	// A wrong value followed by a right one, and the other way round.
	add("attemptFix", a30Runs, func(j *stream.Job) string {
		if j.Attempt != 0 {
			return fmt.Sprintf("attempt %d, want 0", j.Attempt)
		}
		return ""
	}, []string{"type", "t", "job_id", jid("attemptFix"), "attempt", "-1", "payload", "{}", "attempt", "0"})
	add("attemptBreak", a30Malformed, nil,
		[]string{"type", "t", "job_id", jid("attemptBreak"), "attempt", "0", "payload", "{}", "attempt", "-1"})
	add("vFix", a30Runs, nil, []string{"v", "2", "type", "t", "job_id", jid("vFix"), "v", "1"})
	add("typeEmptyLast", a30Malformed, nil, []string{"type", "t", "job_id", jid("typeEmptyLast"), "type", ""})

	// Size: only the last value of a name counts.
	x15, y15 := strings.Repeat("x", 15000), strings.Repeat("y", 15000)
	add("sizeDupOK", a30Runs, func(j *stream.Job) string {
		if string(j.Payload) != y15 {
			return fmt.Sprintf("payload of %d bytes starting %q, want the last one (15000 y)", len(j.Payload), string(j.Payload[:min(len(j.Payload), 8)]))
		}
		return ""
	}, []string{"type", "t", "job_id", jid("sizeDupOK"), "payload", x15, "payload", y15})
	add("sizeFirstBig", a30Runs, func(j *stream.Job) string {
		if string(j.Payload) != "{}" {
			return fmt.Sprintf("payload of %d bytes, want {}", len(j.Payload))
		}
		return ""
	}, []string{"type", "t", "job_id", jid("sizeFirstBig"), "payload", strings.Repeat("x", 30000), "payload", "{}"})
	add("sizeLastBig", a30Oversize, nil,
		[]string{"type", "t", "payload", "{}", "job_id", jid("sizeLastBig"), "payload", strings.Repeat("y", 25000)})
	// Exactly at the limit counted as documented, over it in the stream.
	{
		id := jid("sizeExact")
		base := []string{"type", "t", "job_id", id, "h.pad", strings.Repeat("x", 10000), "payload", "{}", "h.pad", ""}
		k := a30MaxBytes - a30Counted(base)
		base[len(base)-1] = strings.Repeat("q", k)
		if a30Counted(base) != a30MaxBytes {
			panic("sizeExact")
		}
		add("sizeExact", a30Runs, func(j *stream.Job) string {
			if len(j.Headers["pad"]) != k {
				return fmt.Sprintf("h.pad of %d bytes, want the last (%d)", len(j.Headers["pad"]), k)
			}
			return ""
		}, base)
	}
	// One byte over, with names given twice in an order that differs from
	// name order.
	{
		id := jid("sizeOver1")
		f := []string{"type", "t", "zeta", "z1", "h.pad", strings.Repeat("x", 10000), "alpha", "a1", "payload", "{}",
			"zeta", "z2", "job_id", id, "alpha", "a2", "h.pad", ""}
		f[len(f)-1] = strings.Repeat("q", a30MaxBytes+1-a30Counted(f))
		if a30Counted(f) != a30MaxBytes+1 {
			panic("sizeOver1")
		}
		add("sizeOver1", a30Oversize, nil, f)
	}
	// Over the size limit and over the field limit: oversize first.
	add("sizeOverFields", a30Oversize, nil,
		[]string{"type", "t", "job_id", jid("sizeOverFields"), "payload", "{}"},
		a30Headers("h.k", 1001, a30Const("v")),
		[]string{"payload", strings.Repeat("y", 15000)})
	// Which field an oversize entry is reported for must not depend on the
	// read: two fields of equal size (a tie), one given twice, and two
	// fields whose running total crosses the limit at a different one in
	// the stream's order and in name order.
	add("sizeTie", a30Oversize, nil,
		[]string{"type", "t", "job_id", jid("sizeTie"), "zz", strings.Repeat("z", 10000), "aa", strings.Repeat("a", 10000)})
	add("sizeTieDup", a30Oversize, nil,
		[]string{"type", "t", "aa", "small", "job_id", jid("sizeTieDup"), "zz", strings.Repeat("z", 10000), "aa", strings.Repeat("a", 10000)})
	add("sizeCross", a30Oversize, nil,
		[]string{"type", "t", "job_id", jid("sizeCross"), "zz", strings.Repeat("z", 12000), "aa", strings.Repeat("a", 9000)})
	// Several wrong fields: reported for the one whose name sorts first.
	add("twoWrong", a30Malformed, nil,
		[]string{"type", "t", "max_attempts", "-1", "job_id", jid("twoWrong"), "created_at", "", "attempt", "0", "attempt", "x"})
	// Over the field limit, over the size limit in the stream only because
	// of a value given twice: a field-limit verdict, not an oversize one.
	add("fieldsNotSize", a30Malformed, nil,
		[]string{"type", "t", "job_id", jid("fieldsNotSize"), "payload", strings.Repeat("x", 15000)},
		a30Headers("h.k", 1001, a30Const("v")),
		[]string{"payload", "{}"})
	// Oversize with more fields than a dead letter copies: in the stream
	// (1,603 with duplicates; 803 distinct), and distinct (3,003).
	add("sizeManyDup", a30Oversize, nil,
		[]string{"type", "t", "job_id", jid("sizeManyDup"), "payload", "{}"},
		a30Headers("h.k", 800, a30Const("a")), a30Headers("h.k", 800, a30Const("b")),
		[]string{"payload", strings.Repeat("y", 15000)})
	add("sizeManyFields", a30Oversize, nil,
		[]string{"type", "t", "job_id", jid("sizeManyFields"), "payload", strings.Repeat("y", 15000)},
		a30Headers("h.k", 3000, a30Const("v")))
	return es
}

// ---------------------------------------------------------------------------
// One scenario: the matrix's entries read over one path with one protocol.

type a30Outcome struct {
	entryID string
	paths   []string
	runs    int
	job     *stream.Job
	dead    [][]string // the raw fields of each dead letter of this entry
}

type a30Scenario struct {
	t       *testing.T
	rdb     *redis.Client
	reads   *a30Reads
	q, dead string
	mu      sync.Mutex
	runs    map[string]int // entry ID of s.q: runs
	jobs    map[string]*stream.Job
	other   map[string]int // runs of the fillers of another stream: job ID: runs
}

func newA30Scenario(t *testing.T, proto int, opts ...func(*redis.Options)) *a30Scenario {
	t.Helper()
	opt := *redistest.Shared(t).Options()
	opt.Protocol = proto
	for _, o := range opts {
		o(&opt)
	}
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { rdb.Close() })
	q := redistest.Name(t)
	keys, err := stream.KeysFor(q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		redistest.DeleteKeys(rdb, q+"*")
		redistest.DeleteKeys(rdb, "{"+q+"*")
	})
	s := &a30Scenario{t: t, rdb: rdb, reads: newA30Reads(), q: q, dead: keys.Dead,
		runs: map[string]int{}, jobs: map[string]*stream.Job{}, other: map[string]int{}}
	if err := rdb.XGroupCreateMkStream(context.Background(), q, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// start runs a consumer named "c" whose handler records every run by entry
// ID; it is shut down when the test ends.
func (s *a30Scenario) start(cfg consumer.Config) *consumer.Consumer {
	s.t.Helper()
	cfg.Stream, cfg.Group, cfg.Consumer = s.q, "g", "c"
	cfg.MaxEntryBytes = a30MaxBytes
	cfg.Logger = slog.New(slog.DiscardHandler)
	s.rdb.AddHook(s.reads)
	c := consumer.New(s.rdb, cfg).Handle(s.handler())
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			s.t.Errorf("Shutdown: %v", err)
		}
		<-done
	})
	select {
	case <-c.Reading():
	case err := <-done:
		done <- err // for the cleanup
		s.t.Fatalf("Run returned before reading: %v", err)
	case <-time.After(60 * time.Second):
		s.t.Fatalf("the consumer did not start reading within 60s")
	}
	return c
}

// settled waits until entry id (label) ran, or was read and nothing is
// pending any more.
func (s *a30Scenario) settled(id, label string) {
	s.t.Helper()
	a30Until(s.t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		if s.ran(id) > 0 {
			return true, ""
		}
		n, _ := s.rdb.XPending(context.Background(), s.q, "g").Result()
		return n != nil && n.Count == 0 && len(s.reads.of(id)) > 0, fmt.Sprintf("%s not settled", label)
	})
}

// handler records every run: by entry ID for s.q, by job ID for any other
// stream.
func (s *a30Scenario) handler() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if j.Stream != s.q {
			s.other[j.ID]++
			return nil
		}
		s.runs[j.EntryID]++
		s.jobs[j.EntryID] = j
		return nil
	})
}

// startPool runs a pool of two queues, s.q and other, read by one shared
// XREADGROUP (same group and consumer name); it is shut down when the test
// ends.
func (s *a30Scenario) startPool(other string, max, prefetch int) *consumer.Queue {
	s.t.Helper()
	s.rdb.AddHook(s.reads)
	p := consumer.NewPool(s.rdb, consumer.PoolConfig{Concurrency: 2, Logger: slog.New(slog.DiscardHandler)})
	qa := p.Add(consumer.Config{Stream: s.q, Group: "g", Consumer: "c", MaxEntryBytes: a30MaxBytes, Prefetch: prefetch},
		consumer.QueueOptions{Max: max}).Handle(s.handler())
	p.Add(consumer.Config{Stream: other, Group: "g", Consumer: "c", MaxEntryBytes: a30MaxBytes, Prefetch: prefetch},
		consumer.QueueOptions{Max: max}).Handle(s.handler())
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			s.t.Errorf("pool Shutdown: %v", err)
		}
		<-done
	})
	a30Until(s.t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			s.t.Fatalf("pool Run returned: %v", err)
		default:
		}
		h := p.Health()
		return h.Ready, "pool not ready: " + h.Problem
	})
	return qa
}

func (s *a30Scenario) ran(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// deadLetters returns the dead-letter stream's entries, raw and in order.
func (s *a30Scenario) deadLetters() (ids []string, fields [][]string) {
	s.t.Helper()
	res, err := s.rdb.Do(context.Background(), "XRANGE", s.dead, "-", "+").Slice()
	if err != nil {
		s.t.Fatalf("XRANGE %s: %v", s.dead, err)
	}
	for _, e := range res {
		pair := e.([]any)
		var f []string
		for _, v := range pair[1].([]any) {
			f = append(f, v.(string))
		}
		ids = append(ids, pair[0].(string))
		fields = append(fields, f)
	}
	return ids, fields
}

func a30Field(fields []string, name string) (string, bool) {
	v, ok := "", false
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == name {
			v, ok = fields[i+1], true
		}
	}
	return v, ok
}

// a30Job returns the fields that are not dead_*, in order.
func a30Job(fields []string) []string {
	var out []string
	for i := 0; i+1 < len(fields); i += 2 {
		if !strings.HasPrefix(fields[i], "dead_") {
			out = append(out, fields[i], fields[i+1])
		}
	}
	return out
}

// waitSettled waits until every entry ran or has a dead letter and nothing
// is pending, then until the consumer is idle, and returns each entry's
// outcome.
func (s *a30Scenario) waitSettled(stats func() consumer.Stats, idle func(context.Context) error, ids map[string]string, extra []string) map[string]*a30Outcome {
	s.t.Helper()
	ctx := context.Background()
	a30Until(s.t, 90*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, dls := s.deadLetters()
		deadOf := map[string]bool{}
		for _, d := range dls {
			if id, ok := a30Field(d, "dead_entry_id"); ok {
				deadOf[id] = true
			}
		}
		var missing []string
		for label, id := range ids {
			if s.ran(id) == 0 && !deadOf[id] {
				missing = append(missing, label)
			}
		}
		for _, id := range extra {
			if s.ran(id) == 0 && !deadOf[id] {
				missing = append(missing, "filler "+id)
			}
		}
		p, err := s.rdb.XPending(ctx, s.q, "g").Result()
		if err != nil {
			return false, err.Error()
		}
		sort.Strings(missing)
		return len(missing) == 0 && p.Count == 0, fmt.Sprintf("not settled: %v; %d pending; stats %+v", missing, p.Count, stats())
	})
	if idle != nil {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := idle(wctx); err != nil {
			s.t.Fatalf("WaitIdle: %v", err)
		}
	}
	out := map[string]*a30Outcome{}
	for label, id := range ids {
		out[label] = &a30Outcome{entryID: id, paths: s.reads.of(id)}
	}
	byID := map[string]*a30Outcome{}
	for _, o := range out {
		byID[o.entryID] = o
	}
	s.mu.Lock()
	for id, n := range s.runs {
		if o, ok := byID[id]; ok {
			o.runs, o.job = n, s.jobs[id]
		}
	}
	s.mu.Unlock()
	_, dls := s.deadLetters()
	for _, d := range dls {
		id, _ := a30Field(d, "dead_entry_id")
		if o, ok := byID[id]; ok {
			o.dead = append(o.dead, d)
		} else {
			s.t.Errorf("a dead letter of no hostile entry (dead_entry_id %q): %.300q", id, d)
		}
	}
	for _, id := range extra {
		if n := s.ran(id); n != 1 {
			s.t.Errorf("filler %s ran %d times, want once", id, n)
		}
	}
	return out
}

func a30Until(t *testing.T, timeout, every time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, state)
		}
		time.Sleep(every)
	}
}

// a30Verdicts collects each entry's verdict on every run of the matrix.
type a30Verdicts struct {
	mu sync.Mutex
	m  map[string]map[string]string // label -> run -> verdict text
}

func (v *a30Verdicts) put(label, run, verdict string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m[label] == nil {
		v.m[label] = map[string]string{}
	}
	v.m[label][run] = verdict
}

// check compares each entry's outcome with what the documentation says,
// and records its verdict for the comparison across reads.
func (s *a30Scenario) check(es []a30Entry, out map[string]*a30Outcome, run string, verdicts *a30Verdicts) {
	t := s.t
	t.Helper()
	for _, e := range es {
		o := out[e.label]
		paths := strings.Join(o.paths, ",")
		where := fmt.Sprintf("%s (entry %s, %d fields in the stream, %d bytes counted, %d raw; delivered by %q)",
			e.label, o.entryID, len(e.fields)/2, a30Counted(e.fields), a30Raw(e.fields), paths)
		switch e.want {
		case a30Runs:
			verdicts.put(e.label, run, "ran")
			if o.runs != 1 || len(o.dead) != 0 {
				var why []string
				for _, d := range o.dead {
					r, _ := a30Field(d, "dead_reason")
					de, _ := a30Field(d, "dead_error")
					why = append(why, r+": "+de)
				}
				t.Errorf("%s: ran %d times and has %d dead letters %q; want it run once (valid per the doc: duplicates count once, the last value is decoded)",
					where, o.runs, len(o.dead), why)
				continue
			}
			if e.check != nil {
				if msg := e.check(o.job); msg != "" {
					t.Errorf("%s: job decoded wrong: %s", where, msg)
				}
			}
			if o.job.ID != "J-"+e.label {
				t.Errorf("%s: job ID %q, want %q", where, o.job.ID, "J-"+e.label)
			}
		case a30Malformed, a30Oversize:
			if o.runs != 0 {
				t.Errorf("%s: a malformed entry ran %d times", where, o.runs)
			}
			if len(o.dead) != 1 {
				t.Errorf("%s: %d dead letters, want exactly 1", where, len(o.dead))
				verdicts.put(e.label, run, fmt.Sprintf("%d dead letters", len(o.dead)))
				continue
			}
			d := o.dead[0]
			reason, _ := a30Field(d, "dead_reason")
			derr, _ := a30Field(d, "dead_error")
			trunc, hasTrunc := a30Field(d, "dead_truncated")
			dropped, hasDropped := a30Field(d, "dead_dropped_fields")
			verdicts.put(e.label, run, fmt.Sprintf("dead %s: %s; dead_truncated %q", reason,
				strings.ReplaceAll(derr, o.entryID, "<id>"), trunc))
			if reason != consumer.ReasonMalformed {
				t.Errorf("%s: dead_reason %q, want malformed", where, reason)
			}
			job := a30Job(d)
			if e.want == a30Malformed {
				// Copied from the stream: every field, duplicates, in order,
				// up to 1,100; beyond, one value per name (the last).
				want, wantDropped := a30Held(e.fields)
				if dropped != wantDropped || hasDropped != (wantDropped != "") {
					t.Errorf("%s: dead_dropped_fields %q (present %v), want %q", where, dropped, hasDropped, wantDropped)
				}
				if hasTrunc {
					t.Errorf("%s: dead_truncated %q on an entry within the size limit", where, trunc)
				}
				if !slices.Equal(job, want) {
					t.Errorf("%s: dead letter's job fields (%d) are not the stream's fields in order (%d): first difference %s",
						where, len(job)/2, len(want)/2, a30Diff(job, want))
				}
				continue
			}
			// Oversize: recorded from what the consumer read, values cut to
			// 1 KiB, dead_truncated the size; in the stream's order after a
			// raw read, merged in name order after any other.
			if !hasTrunc {
				t.Errorf("%s: no dead_truncated on an oversize entry's dead letter", where)
			} else if trunc != strconv.Itoa(a30Counted(e.fields)) {
				t.Errorf("%s: dead_truncated %s; want the entry's size as counted (%d: only the last value of a name counts; raw %d)",
					where, trunc, a30Counted(e.fields), a30Raw(e.fields))
			}
			if !strings.Contains(derr, "over") && !strings.Contains(derr, "size") && !strings.Contains(derr, "large") {
				t.Logf("%s: dead_error %q (oversize expected to be reported first)", where, derr)
			}
			// What a dead letter holds of the fields as read (a30Held): in
			// the stream's order, or after a typed XREADGROUP one value per
			// name in name order.
			rawShape, rawDropped := a30Held(a30RawShape(e.fields))
			merged, mergedDropped := a30Held(a30MergedShape(e.fields))
			typed := len(o.paths) == 1 && (strings.HasPrefix(o.paths[0], "block") || o.paths[0] == "typed-noblock")
			isRaw, isMerged := slices.Equal(job, rawShape), slices.Equal(job, merged)
			switch {
			case !isRaw && !isMerged:
				t.Errorf("%s: oversize dead letter has neither documented shape: %d fields, first difference from the stream order %s, from the merged %s",
					where, len(job)/2, a30Diff(job, rawShape), a30Diff(job, merged))
			case len(o.paths) == 1 && !typed && !isRaw:
				t.Errorf("%s: read by %q but its dead letter is merged in name order; the doc says in the stream's order", where, o.paths[0])
			case typed && !isMerged:
				t.Errorf("%s: read by %q (typed) but its dead letter keeps the stream's order and duplicates; the doc says one value per name, in name order, for a typed read", where, o.paths[0])
			}
			switch {
			case isRaw && dropped != rawDropped, isMerged && dropped != mergedDropped:
				t.Errorf("%s: dead_dropped_fields %q; want %q (fields as read beyond the 1,100 copied)", where, dropped,
					map[bool]string{true: rawDropped, false: mergedDropped}[isRaw])
			}
		}
	}
}

// a30Diff describes the first difference of two field lists.
func a30Diff(got, want []string) string {
	for i := 0; i < min(len(got), len(want)); i++ {
		if got[i] != want[i] {
			return fmt.Sprintf("at %d: got %.40q, want %.40q", i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("lengths %d and %d", len(got), len(want))
	}
	return "none"
}

// a30Run runs the matrix over path on a proto client and returns how many
// of its entries were delivered by that path (only).
func a30Run(t *testing.T, path string, proto int, es []a30Entry, verdicts *a30Verdicts, run string) (hit, total int) {
	var opts []func(*redis.Options)
	if path == "block-typed" {
		// A ReadTimeout under Block plus a second: blocking reads stay
		// go-redis's typed ones (README).
		opts = append(opts, func(o *redis.Options) { o.ReadTimeout = time.Second })
	}
	s := newA30Scenario(t, proto, opts...)
	ctx := context.Background()
	ids := map[string]string{}
	var fillers []string
	var c *consumer.Consumer
	var qa *consumer.Queue
	want := path // the hook's label of the read path
	other := s.q + ":other"
	otherJobs := 0
	addOther := func(pipe redis.Pipeliner) {
		otherJobs++
		// IDs of their own, which no entry of s.q has.
		pipe.Do(ctx, "XADD", other, fmt.Sprintf("1-%d", otherJobs), "type", "t", "job_id", fmt.Sprintf("other-%d", otherJobs), "payload", "{}")
	}
	if strings.HasPrefix(path, "pool") {
		if err := s.rdb.XGroupCreateMkStream(ctx, other, "g", "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	switch path {
	case "block", "block-typed":
		// An idle consumer: each entry is added once the previous one has
		// settled, so that it arrives in a blocking read: raw when the
		// client's ReadTimeout leaves room for Block (the default), else
		// typed (README).
		if path == "block" {
			want = "raw"
			c = s.start(consumer.Config{Concurrency: 4})
		} else {
			want = "block"
			c = s.start(consumer.Config{Concurrency: 4, Block: 200 * time.Millisecond})
		}
		for _, e := range es {
			id := rawXADD(t, s.rdb, s.q, "*", e.fields...)
			ids[e.label] = id
			s.settled(id, e.label)
		}
	case "pool-shared":
		// An idle pool of two queues: each entry is added with a job of
		// the other queue in one transaction, so that one shared blocking
		// read of both streams returns both.
		want = "raw-multi"
		qa = s.startPool(other, 2, 0)
		for _, e := range es {
			pipe := s.rdb.TxPipeline()
			xadd := pipe.Do(ctx, append([]any{"XADD", s.q, "*"}, a30Any(e.fields)...)...)
			addOther(pipe)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			id := xadd.Val().(string)
			ids[e.label] = id
			s.settled(id, e.label)
		}
	case "pool-backlog":
		// Both queues backlogged, read a job or two at a time: the pool
		// reads by turns a queue alone (raw, as a consumer's backlog read)
		// and both together (a shared read).
		want = "raw|raw-multi"
		pipe := s.rdb.Pipeline()
		for range 3 * len(es) {
			addOther(pipe)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			fillers = append(fillers, rawXADD(t, s.rdb, s.q, "*", "type", "t", "job_id", "filler-"+strconv.Itoa(i), "payload", "{}"))
		}
		for i, e := range es {
			ids[e.label] = rawXADD(t, s.rdb, s.q, "*", e.fields...)
			fillers = append(fillers, rawXADD(t, s.rdb, s.q, "*", "type", "t", "job_id", fmt.Sprintf("filler-after-%d", i), "payload", "{}"))
		}
		qa = s.startPool(other, 1, 1)
	case "raw":
		// A backlog read one or two at a time: after the first read, every
		// read is full, and its reply is parsed raw.
		for i := range 6 {
			fillers = append(fillers, rawXADD(t, s.rdb, s.q, "*", "type", "t", "job_id", "filler-"+strconv.Itoa(i), "payload", "{}"))
		}
		for i, e := range es {
			ids[e.label] = rawXADD(t, s.rdb, s.q, "*", e.fields...)
			fillers = append(fillers, rawXADD(t, s.rdb, s.q, "*", "type", "t", "job_id", fmt.Sprintf("filler-after-%d", i), "payload", "{}"))
		}
		c = s.start(consumer.Config{Concurrency: 1, Prefetch: 1})
	case "claim":
		// Left pending by a consumer that died: reclaimed after the
		// visibility timeout.
		for _, e := range es {
			ids[e.label] = rawXADD(t, s.rdb, s.q, "*", e.fields...)
		}
		if err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{s.q, ">"}, Count: 1000}).Err(); err != nil {
			t.Fatal(err)
		}
		c = s.start(consumer.Config{Concurrency: 2, VisibilityTimeout: 5 * time.Second})
	case "pending":
		// Left pending by an earlier process of the same consumer name:
		// re-read at start.
		for _, e := range es {
			ids[e.label] = rawXADD(t, s.rdb, s.q, "*", e.fields...)
		}
		if err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{s.q, ">"}, Count: 1000}).Err(); err != nil {
			t.Fatal(err)
		}
		c = s.start(consumer.Config{Concurrency: 2})
	}
	var out map[string]*a30Outcome
	if c != nil {
		out = s.waitSettled(c.Stats, c.WaitIdle, ids, fillers)
	} else {
		out = s.waitSettled(qa.Stats, nil, ids, fillers)
		a30Until(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			p, _ := s.rdb.XPending(ctx, other, "g").Result()
			return len(s.other) == otherJobs && p != nil && p.Count == 0, fmt.Sprintf("%d of %d jobs of the other queue ran", len(s.other), otherJobs)
		})
		s.mu.Lock()
		for id, n := range s.other {
			if n != 1 {
				t.Errorf("job %s of the other queue ran %d times, want once", id, n)
			}
		}
		s.mu.Unlock()
	}
	s.check(es, out, run, verdicts)
	for _, o := range out {
		total++
		if len(o.paths) >= 1 && slices.Contains(strings.Split(want, "|"), o.paths[0]) {
			hit++
		}
	}
	s.reads.mu.Lock()
	if len(s.reads.odd) > 0 {
		t.Logf("replies the hook could not classify: %q", s.reads.odd)
	}
	s.reads.mu.Unlock()
	var notHit []string
	for label, o := range out {
		if len(o.paths) == 0 || !slices.Contains(strings.Split(want, "|"), o.paths[0]) {
			notHit = append(notHit, fmt.Sprintf("%s by %q", label, o.paths))
		}
	}
	if len(notHit) > 0 {
		t.Logf("entries not first delivered by %s: %v", want, notHit)
	}
	return hit, total
}

// Duplicate field names, at and over the field and size limits, read over
// every read path (a consumer's four, a pool's two) on RESP2 and RESP3: each entry gets the documented verdict
// on every read (the same one), a valid one runs once with the last values,
// a malformed one ends in exactly one dead letter of a documented shape.
func TestAttack30_duplicatesEveryReadPath(t *testing.T) {
	t.Parallel()
	es := a30Matrix()
	verdicts := &a30Verdicts{m: map[string]map[string]string{}}
	t.Run("matrix", func(t *testing.T) {
		for _, proto := range []int{2, 3} {
			for _, path := range []string{"block", "block-typed", "raw", "claim", "pending", "pool-shared", "pool-backlog"} {
				t.Run(fmt.Sprintf("%s/resp%d", path, proto), func(t *testing.T) {
					t.Parallel()
					// The raw path depends on the consumer's read sizes: if
					// too few entries came by it, run the scenario again.
					for try := 1; ; try++ {
						hit, total := a30Run(t, path, proto, es, verdicts, fmt.Sprintf("%s/resp%d#%d", path, proto, try))
						t.Logf("try %d: %d of %d hostile entries delivered by %s", try, hit, total, path)
						if t.Failed() || hit*2 >= total || try == 3 {
							if hit == 0 {
								t.Logf("precondition not met: no entry was delivered by %s after %d tries", path, try)
							}
							return
						}
					}
				})
			}
		}
	})
	// The same verdict on every read.
	for _, e := range es {
		runs := verdicts.m[e.label]
		for _, v := range runs {
			t.Logf("%s: %.200s", e.label, v)
			break
		}
		seen := map[string][]string{}
		for run, v := range runs {
			seen[v] = append(seen[v], run)
		}
		if len(seen) > 1 {
			var parts []string
			for v, rs := range seen {
				sort.Strings(rs)
				parts = append(parts, fmt.Sprintf("%q on %v", v, rs))
			}
			sort.Strings(parts)
			t.Errorf("%s: verdicts differ between reads: %s", e.label, strings.Join(parts, "; "))
		}
	}
}

// ---------------------------------------------------------------------------
// Replay: job_id and created_at of a job written by redis-cli.

// A job written with XADD alone (no job_id, no created_at, or with the
// duplicates and empty values that mean the same), dead-lettered and then
// replayed, runs with Job.ID its first entry's ID and Job.CreatedAt that
// entry's time; the replayed entry holds the raw fields in order without
// dead_* and attempt, plus replayed_from and replay_count.
func TestAttack30_replayDefaults(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			a30Replay(t, proto, []a30ReplayCase{
				{"bare", []string{"type", "t", "payload", `{"n":1}`}},
				{"createdZero", []string{"type", "t", "created_at", "0", "h.x", "1", "payload", "{}"}},
				{"emptyJobID", []string{"type", "t", "job_id", "", "payload", "{}", "created_at", "0"}},
				{"dupAttempt", []string{"type", "t", "attempt", "3", "payload", "{}", "attempt", "0", "max_attempts", "9"}},
				{"retriedFirst", []string{"type", "retry-then-die", "payload", "{}", "h.k", "a", "h.k", "b"}},
			})
		})
	}
}

// The same with duplicate job_id and created_at fields, whose last value
// is what the decoder sees: "stale" then "" (no job_id: the entry ID), "5"
// then "0" (no created_at: the entry's time); and "" then "mine", "0" then
// "777". The replayed job must keep the ID and creation time it had.
func TestAttack30_replayDuplicateIdentity(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", proto), func(t *testing.T) {
			t.Parallel()
			a30Replay(t, proto, []a30ReplayCase{
				{"dupCleared", []string{"type", "t", "job_id", "stale", "created_at", "5", "payload", "{}", "job_id", "", "created_at", "0"}},
				{"dupSet", []string{"type", "t", "job_id", "", "created_at", "0", "payload", "{}", "job_id", "mine", "created_at", "777"}},
			})
		})
	}
}

func a30EntryMs(t *testing.T, id string) int64 {
	t.Helper()
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		t.Fatalf("entry ID %q", id)
	}
	return n
}

type a30ReplayCase struct {
	label  string
	fields []string
}

func a30Replay(t *testing.T, proto int, cases []a30ReplayCase) {
	s := newA30Scenario(t, proto)
	ctx := context.Background()
	first := map[string]string{} // label: first entry ID
	label := map[string]string{} // job ID seen on the first run: label
	var mu sync.Mutex
	firstRun := map[string]*stream.Job{}
	runsByLabel := map[string]int{}
	for _, c := range cases {
		first[c.label] = rawXADD(t, s.rdb, s.q, "*", c.fields...)
	}
	for l, id := range first {
		label[id] = l
	}
	if _, ok := first["dupSet"]; ok {
		label["mine"] = "dupSet"
	}
	// The job's ID and creation time (Unix ms) as the doc defines them.
	wantID := func(l string) string {
		if l == "dupSet" {
			return "mine"
		}
		return first[l]
	}
	wantCreated := func(l string) int64 {
		if l == "dupSet" {
			return 777
		}
		return a30EntryMs(t, first[l])
	}
	// Phase 1: every job dies (retriedFirst after one retry).
	cfg := consumer.Config{Stream: s.q, Group: "g", Consumer: "c1", Logger: slog.New(slog.DiscardHandler),
		PromoteInterval: 20 * time.Millisecond, Backoff: consumer.Backoff{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond}}
	c1 := consumer.New(s.rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		defer mu.Unlock()
		l := label[j.ID]
		runsByLabel[l]++
		if firstRun[l] == nil {
			firstRun[l] = j
		}
		if j.Type == "retry-then-die" && j.Attempt == 0 {
			return errors.New("try again")
		}
		return consumer.Permanent(errors.New("die"))
	}))
	done := make(chan error, 1)
	go func() { done <- c1.Run(context.Background()) }()
	a30Until(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		n, _ := s.rdb.XLen(ctx, s.dead).Result()
		p, _ := s.rdb.XPending(ctx, s.q, "g").Result()
		mu.Lock()
		defer mu.Unlock()
		return n == int64(len(cases)) && p != nil && p.Count == 0, fmt.Sprintf("%d dead letters, want %d; runs %v", n, len(cases), runsByLabel)
	})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := c1.Shutdown(sctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	cancel()
	<-done
	mu.Lock()
	for _, c := range cases {
		j := firstRun[c.label]
		want := 1
		if c.label == "retriedFirst" {
			want = 2
		}
		switch {
		case j == nil:
			t.Errorf("%s: never ran (runs %v)", c.label, runsByLabel)
		case runsByLabel[c.label] != want:
			t.Errorf("%s: ran %d times before dying, want %d", c.label, runsByLabel[c.label], want)
		case j.ID != wantID(c.label) || j.CreatedAt.UnixMilli() != wantCreated(c.label):
			t.Errorf("%s: first run had ID %q created %d; want %s and %d", c.label, j.ID, j.CreatedAt.UnixMilli(), wantID(c.label), wantCreated(c.label))
		}
	}
	mu.Unlock()

	deadIDs, deadFields := s.deadLetters()
	deadOf := map[string]int{} // label: index in the dead-letter stream
	for i, d := range deadFields {
		src, _ := a30Field(d, "dead_entry_id")
		l, ok := label[src]
		if !ok {
			// a retry's entry: its job_id names the first entry.
			jid, _ := a30Field(d, "job_id")
			l, ok = label[jid]
		}
		if !ok {
			t.Fatalf("dead letter %s of an unknown job: %.300q", deadIDs[i], d)
		}
		deadOf[l] = i
	}
	d, err := dlq.New(s.rdb, s.q, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if res.Replayed != len(cases) {
		t.Fatalf("Replay = %+v; want %d replayed", res, len(cases))
	}
	// The replayed entries, raw.
	all, err := s.rdb.Do(ctx, "XRANGE", s.q, "-", "+").Slice()
	if err != nil {
		t.Fatal(err)
	}
	replayedEntry := map[string]string{} // label: new entry ID
	for _, e := range all {
		pair := e.([]any)
		var f []string
		for _, v := range pair[1].([]any) {
			f = append(f, v.(string))
		}
		from, ok := a30Field(f, "replayed_from")
		if !ok {
			continue
		}
		var l string
		for lab, i := range deadOf {
			if deadIDs[i] == from {
				l = lab
			}
		}
		if l == "" {
			t.Errorf("replayed entry %s names dead letter %s, which was none of ours", pair[0], from)
			continue
		}
		replayedEntry[l] = pair[0].(string)
		// Expected: the dead letter's fields in order without dead_* and
		// attempt, plus replayed_from, replay_count, and job_id and
		// created_at where the job had none.
		var keep []string
		for _, x := range [][]string{a30Job(deadFields[deadOf[l]])} {
			for i := 0; i+1 < len(x); i += 2 {
				if x[i] != "attempt" {
					keep = append(keep, x[i], x[i+1])
				}
			}
		}
		var rest []string
		j := 0
		for i := 0; i+1 < len(f); i += 2 {
			if j+1 < len(keep) && f[i] == keep[j] && f[i+1] == keep[j+1] {
				j += 2
				continue
			}
			rest = append(rest, f[i], f[i+1])
		}
		if j != len(keep) {
			t.Errorf("%s: replayed entry %q does not hold the dead letter's job fields %q in order", l, f, keep)
		}
		for i := 0; i+1 < len(rest); i += 2 {
			switch rest[i] {
			case "replayed_from", "replay_count", "job_id", "created_at":
			default:
				t.Errorf("%s: replayed entry has an unexpected field %q=%q: %q", l, rest[i], rest[i+1], f)
			}
		}
		if _, ok := a30Field(f, "attempt"); ok {
			t.Errorf("%s: replayed entry keeps attempt: %q", l, f)
		}
		if rc, _ := a30Field(f, "replay_count"); rc != "1" {
			t.Errorf("%s: replay_count %q, want 1", l, rc)
		}
		if v, _ := a30Field(f, "job_id"); v != wantID(l) {
			t.Errorf("%s: replayed entry's job_id (last value, what the decoder sees) %q; want %s (the first entry's ID when the job had none): %q", l, v, wantID(l), f)
		}
		if v, _ := a30Field(f, "created_at"); v != strconv.FormatInt(wantCreated(l), 10) {
			t.Errorf("%s: replayed entry's created_at (last value) %q; want %d (the first entry's time when the job had none or 0): %q", l, v, wantCreated(l), f)
		}
	}
	if len(replayedEntry) != len(cases) {
		t.Errorf("%d replayed entries found in the stream, want %d", len(replayedEntry), len(cases))
	}

	// Phase 2: a new consumer runs the replayed jobs.
	var mu2 sync.Mutex
	got := map[string][]*stream.Job{} // entry ID: runs
	cfg.Consumer = "c2"
	c2 := consumer.New(s.rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu2.Lock()
		defer mu2.Unlock()
		got[j.EntryID] = append(got[j.EntryID], j)
		return nil
	}))
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c2.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-done2
	})
	a30Until(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		p, _ := s.rdb.XPending(ctx, s.q, "g").Result()
		mu2.Lock()
		defer mu2.Unlock()
		n := 0
		for _, id := range replayedEntry {
			if len(got[id]) > 0 {
				n++
			}
		}
		return n == len(replayedEntry) && p != nil && p.Count == 0, fmt.Sprintf("%d of %d replayed jobs ran", n, len(replayedEntry))
	})
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	if err := c2.WaitIdle(wctx); err != nil {
		t.Fatalf("WaitIdle: %v", err)
	}
	mu2.Lock()
	defer mu2.Unlock()
	for l, id := range replayedEntry {
		runs := got[id]
		if len(runs) != 1 {
			t.Errorf("%s: replayed job ran %d times, want once", l, len(runs))
			continue
		}
		j := runs[0]
		if j.ID != wantID(l) {
			t.Errorf("%s (written %q): replayed job has Job.ID %q; want %s, as before it died (docs: a job that had no job_id gets its first entry's ID; replay keeps job_id)",
				l, a30CaseFields(cases, l), j.ID, wantID(l))
		}
		if j.CreatedAt.UnixMilli() != wantCreated(l) {
			t.Errorf("%s (written %q): replayed job has CreatedAt %d; want %d, as before it died (docs: one without created_at, or with 0, gets its first entry's time)",
				l, a30CaseFields(cases, l), j.CreatedAt.UnixMilli(), wantCreated(l))
		}
		if j.Attempt != 0 {
			t.Errorf("%s: replayed job at attempt %d, want 0", l, j.Attempt)
		}
	}
	if n, _ := s.rdb.XLen(ctx, s.dead).Result(); n != 0 {
		t.Errorf("%d dead letters left after the replay and the runs, want 0", n)
	}
}

func a30CaseFields(cases []a30ReplayCase, l string) []string {
	for _, c := range cases {
		if c.label == l {
			return c.fields
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// A valid job with duplicated names and more than 1,100 fields in the
// stream, or with exactly stream.MaxFields headers, dead-lettered by its
// handler, then replayed: the doc says a dead letter keeps all the fields
// up to 1,100 and beyond that one value per name (the last), and a replay
// skips only dead letters not written by a consumer. The replayed job must
// be the job that died, and run.
func TestAttack30_validDuplicatesDeadLetterReplay(t *testing.T) {
	t.Parallel()
	for _, n := range []int{600, 1000} {
		t.Run(fmt.Sprintf("headers%dx2", n), func(t *testing.T) {
			t.Parallel()
			a30DieAndReplay(t, n, true)
		})
	}
}

// a30Held returns what a dead letter holds of fields (docs/wire-format.md):
// all of them up to 1,100; beyond, one value per name (the last), the names
// in the order they first come, at most 1,100 of those; and the count of
// fields left out ("" for none: no dead_dropped_fields).
func a30Held(f []string) ([]string, string) {
	n := len(f) / 2
	if n <= 1100 {
		return f, ""
	}
	h := a30FirstOrderLast(f)
	if len(h)/2 > 1100 {
		h = h[:2*1100]
	}
	return h, strconv.Itoa(n - len(h)/2)
}

// a30FirstOrderLast returns fields with one value per name (the last), the
// names in the order they first come.
func a30FirstOrderLast(fields []string) []string {
	at := map[string]int{}
	var out []string
	for i := 0; i+1 < len(fields); i += 2 {
		if j, ok := at[fields[i]]; ok {
			out[j] = fields[i+1]
		} else {
			at[fields[i]] = len(out) + 1
			out = append(out, fields[i], fields[i+1])
		}
	}
	return out
}

// A valid job with exactly stream.MaxFields headers (no duplicates) that
// its handler dead-letters is replayed and runs: its dead letter is a
// consumer's (at most MaxFields job fields, so not Skipped), and the doc's
// replay puts the job back on its stream, to run again.
func TestAttack30_atFieldLimitReplay(t *testing.T) {
	t.Parallel()
	a30DieAndReplay(t, stream.MaxFields, false)
}

func a30DieAndReplay(t *testing.T, n int, dups bool) {
	s := newA30Scenario(t, 3)
	ctx := context.Background()
	fields := a30Cat([]string{"type", "t", "job_id", "dupjob", "payload", "{}"}, a30Headers("h.k", n, a30Const("old")))
	if dups {
		fields = a30Cat(fields, a30Headers("h.k", n, a30Const("new")))
	}
	src := rawXADD(t, s.rdb, s.q, "*", fields...)
	var mu sync.Mutex
	var jobs []*stream.Job
	died := false
	cfg := consumer.Config{Stream: s.q, Group: "g", Consumer: "c", Logger: slog.New(slog.DiscardHandler)}
	c := consumer.New(s.rdb, cfg).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
		mu.Lock()
		defer mu.Unlock()
		jobs = append(jobs, j)
		if !died {
			died = true
			return consumer.Permanent(errors.New("die once"))
		}
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-done
	})
	a30Until(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		l, _ := s.rdb.XLen(ctx, s.dead).Result()
		return l == 1, fmt.Sprintf("%d dead letters", l)
	})
	dlIDs, dls := s.deadLetters()
	// The job's fields, without the history a failed job's dead
	// letter gets (last_error, error_history).
	var job []string
	for i, f := 0, a30Job(dls[0]); i+1 < len(f); i += 2 {
		if f[i] != "last_error" && f[i] != "error_history" {
			job = append(job, f[i], f[i+1])
		}
	}
	// docs/wire-format.md: a dead letter keeps all the fields as they were
	// up to 1,100; an entry with more keeps one value per name (the last),
	// the names in the order they first come, dead_dropped_fields counting
	// the rest.
	want, wantDropped := fields, ""
	if len(fields)/2 > 1100 {
		want = a30FirstOrderLast(fields)
		wantDropped = strconv.Itoa(len(fields)/2 - len(want)/2)
	}
	dropped, _ := a30Field(dls[0], "dead_dropped_fields")
	if !slices.Equal(job, want) || dropped != wantDropped {
		t.Errorf("the dead letter of a valid job (%d fields in the stream, %d distinct beyond the format's) holds %d fields (dead_dropped_fields %q; first difference %s); want %d (dead_dropped_fields %q)",
			len(fields)/2, n, len(job)/2, dropped, a30Diff(job, want), len(want)/2, wantDropped)
	}
	dq0, err := dlq.New(s.rdb, s.q, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := dq0.Get(ctx, dlIDs[0]); err != nil {
		t.Errorf("dlq Get: %v", err)
	} else if e.Job == nil {
		t.Errorf("the dead letter of a valid job does not decode: %v", e.DecodeErr)
	} else {
		mu.Lock()
		want := jobs[0].Headers
		mu.Unlock()
		changed := 0
		for k, v := range want {
			if e.Job.Headers[k] != v {
				changed++
			}
		}
		if changed > 0 || len(e.Job.Headers) != len(want) {
			t.Errorf("dlq.Entry.Job of the dead letter has %d headers, %d of them with another value than the job that died (%d headers)",
				len(e.Job.Headers), changed, len(want))
		}
	}
	dq, err := dlq.New(s.rdb, s.q, dlq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := dq.Replay(ctx, dlq.Filter{}, dlq.ReplayOptions{})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if res.Replayed != 1 {
		t.Fatalf("Replay = %+v; want the job replayed (docs: Skipped is for dead letters not written by a consumer)", res)
	}
	a30Until(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		_, dls := s.deadLetters()
		if len(jobs) == 1 && len(dls) == 1 {
			r, _ := a30Field(dls[0], "dead_reason")
			e, _ := a30Field(dls[0], "dead_error")
			t.Fatalf("the replayed job did not run: dead-lettered again, %s: %s", r, e)
		}
		return len(jobs) == 2, fmt.Sprintf("%d runs", len(jobs))
	})
	mu.Lock()
	defer mu.Unlock()
	a, b := jobs[0], jobs[1]
	if a.EntryID != src {
		t.Errorf("first run from %s, want %s", a.EntryID, src)
	}
	diff := 0
	example := ""
	for k, v := range a.Headers {
		if b.Headers[k] != v {
			diff++
			if example == "" {
				example = fmt.Sprintf("h.%s %q before, %q after", k, v, b.Headers[k])
			}
		}
	}
	if len(a.Headers) != n || len(b.Headers) != len(a.Headers) || diff > 0 || b.ID != a.ID {
		t.Errorf("the replayed job differs from the job that died: %d headers before, %d after, %d changed (%s), ID %q then %q",
			len(a.Headers), len(b.Headers), diff, example, a.ID, b.ID)
	}
}
