package stream_test

// Outside tests of stream.Field (issue 31), written from its godoc, the godoc of stream.DecodeFields,
// stream.DecodeLimit and stream.Job, and docs/wire-format.md ("Fields" and its notes). The promise
// under attack: for an entry's fields as Redis sends them (name, value, name, value ...), Field
// returns the value DecodeFields decodes for that name (the last value of a name given twice), and
// "" when the name is not there. Each entry is checked two ways: against a plain reference model
// (the last value of the name at an even index) and against what DecodeFields put in the Job, for
// the format's own fields, headers (h.<name> -> Job.Headers) and unknown fields (Job.Extra).
// The godoc of Field says nothing about an odd count, so for odd slices only "no panic" is checked
// (and that DecodeFields rejects them, which its godoc states).

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

const attack31EntryID = "1700000000000-3"

var attack31EntryTime = time.UnixMilli(1700000000000)

// attack31Own lists the wire format's own field names (docs/wire-format.md, "Fields").
var attack31Own = []string{
	stream.FieldVersion, stream.FieldType, stream.FieldPayload, stream.FieldJobID,
	stream.FieldIdempotencyKey, stream.FieldAttempt, stream.FieldMaxAttempts, stream.FieldCreatedAt,
	stream.FieldLockKey, stream.FieldContentType, stream.FieldTraceParent, stream.FieldTraceState,
	stream.FieldLastError, stream.FieldErrorHistory, stream.FieldFirstFailedAt, stream.FieldSuspect,
	stream.FieldTrack,
}

// attack31Probe are names looked up in every entry besides the entry's own names: the format's
// fields, their case variants, near misses (prefixes, suffixes, padded) and names never used.
var attack31Probe = func() []string {
	p := slices.Clone(attack31Own)
	p = append(p, stream.FieldReplayedFrom, stream.FieldReplayCount,
		"", "h.", "h", "Type", "TYPE", "tYPE", "Payload", "JOB_ID", "V", "H.tenant", "h.Tenant",
		"h.tenant", "typ", "types", " type", "type ", "type\x00", "\x00", "\xff", "never-there",
		"dead_reason", "origin")
	return p
}()

// attack31Last is the reference model: the last value of name among the pairs, and whether the
// name is there at all. A trailing unpaired element is not a name with a value.
func attack31Last(fields []string, name string) (string, bool) {
	v, ok := "", false
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == name {
			v, ok = fields[i+1], true
		}
	}
	return v, ok
}

// attack31Field calls stream.Field, turning a panic into an error.
func attack31Field(fields []string, name string) (v string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("Field(%q, %q) panicked: %v", fields, name, r)
		}
	}()
	return stream.Field(fields, name), nil
}

// attack31Decode calls stream.DecodeFields, turning a panic into an error.
func attack31Decode(fields []string) (job *stream.Job, err error, panicErr error) {
	defer func() {
		if r := recover(); r != nil {
			panicErr = fmt.Errorf("DecodeFields(%q) panicked: %v", fields, r)
		}
	}()
	job, err = stream.DecodeFields(attack31EntryID, fields, 0)
	return job, err, nil
}

func attack31IsOwn(name string) bool { return slices.Contains(attack31Own, name) }

// attack31Check checks Field on fields against the model and, when DecodeFields accepts the
// entry, against the decoded Job. It returns whether the entry decoded and every problem found.
func attack31Check(fields []string) (decoded bool, problems []string) {
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	orig := slices.Clone(fields)

	names := slices.Clone(attack31Probe)
	for i, f := range fields {
		names = append(names, f) // values too: a name that is only ever a value is absent
		if i%2 == 0 && len(f) > 0 {
			names = append(names, f[:len(f)-1], f+"x", strings.ToUpper(f), strings.ToLower(f))
		}
	}

	got := make(map[string]string, len(names))
	for _, name := range names {
		v, err := attack31Field(fields, name)
		if err != nil {
			bad("%v", err)
			return false, problems
		}
		got[name] = v
	}
	if !slices.Equal(orig, fields) {
		bad("Field modified its argument: %q became %q", orig, fields)
	}

	job, err, perr := attack31Decode(fields)
	if perr != nil {
		bad("%v", perr)
		return false, problems
	}
	if len(fields)%2 != 0 {
		// Field's godoc says nothing about an odd count: only "no panic" (above).
		// DecodeFields' godoc: "An odd count is rejected."
		if err == nil {
			bad("DecodeFields(%q) with an odd count (%d) = nil error; its godoc says an odd count is rejected", fields, len(fields))
		}
		return false, problems
	}

	// The promise without the decoder: the last value, "" when absent.
	for _, name := range names {
		want, _ := attack31Last(fields, name)
		if got[name] != want {
			bad("Field(%q, %q) = %q, want %q (the last value of the name, \"\" when absent)", fields, name, got[name], want)
		}
	}

	if err != nil {
		var de *stream.DecodeError
		if !errors.As(err, &de) {
			bad("DecodeFields(%q) error %v (%T) is not a *stream.DecodeError", fields, err, err)
		}
		return false, problems
	}
	if job == nil {
		bad("DecodeFields(%q) = nil job, nil error", fields)
		return false, problems
	}

	fv := func(name string) string {
		v, ok := got[name]
		if !ok {
			v = stream.Field(fields, name)
		}
		return v
	}
	present := func(name string) bool { _, ok := attack31Last(fields, name); return ok }

	// Plain string fields: the decoded value is the one Field returns.
	for _, c := range []struct {
		name string
		job  string
	}{
		{stream.FieldType, job.Type},
		{stream.FieldPayload, string(job.Payload)},
		{stream.FieldIdempotencyKey, job.IdempotencyKey},
		{stream.FieldLockKey, job.LockKey},
		{stream.FieldTraceParent, job.TraceParent},
		{stream.FieldTraceState, job.TraceState},
		{stream.FieldLastError, job.LastError},
	} {
		if c.job != fv(c.name) {
			bad("entry %q: Field(%q) = %q but DecodeFields decoded %q", fields, c.name, fv(c.name), c.job)
		}
	}
	if job.Type == "" {
		bad("entry %q: DecodeFields accepted an empty type", fields)
	}
	if present(stream.FieldVersion) && fv(stream.FieldVersion) != "1" {
		bad("entry %q: DecodeFields accepted it, but Field(v) = %q (any v other than 1 is malformed)", fields, fv(stream.FieldVersion))
	}
	if id := fv(stream.FieldJobID); id == "" && job.ID != attack31EntryID || id != "" && job.ID != id {
		bad("entry %q: Field(job_id) = %q but Job.ID = %q (entry ID %s when empty or absent)", fields, id, job.ID, attack31EntryID)
	}
	if ct := fv(stream.FieldContentType); ct == "" && job.ContentType != "" && job.ContentType != stream.ContentTypeJSON || ct != "" && job.ContentType != ct {
		bad("entry %q: Field(content_type) = %q but Job.ContentType = %q", fields, ct, job.ContentType)
	}

	// Integer fields: present means a non-negative decimal integer (an empty value is malformed).
	for _, c := range []struct {
		name string
		job  int
	}{
		{stream.FieldAttempt, job.Attempt},
		{stream.FieldMaxAttempts, job.MaxAttempts},
	} {
		v := fv(c.name)
		if !present(c.name) {
			if c.job != 0 {
				bad("entry %q: no %s, but the Job has %d", fields, c.name, c.job)
			}
			continue
		}
		n, perr := strconv.ParseUint(v, 10, 63)
		if perr != nil {
			bad("entry %q: DecodeFields accepted it, but Field(%s) = %q is not a non-negative decimal integer", fields, c.name, v)
		} else if uint64(c.job) != n {
			bad("entry %q: Field(%s) = %q but the Job has %d", fields, c.name, v, c.job)
		}
	}
	if !present(stream.FieldCreatedAt) {
		if !job.CreatedAt.Equal(attack31EntryTime) {
			bad("entry %q: no created_at, but Job.CreatedAt = %v, want the entry ID's time", fields, job.CreatedAt)
		}
	} else {
		v := fv(stream.FieldCreatedAt)
		n, perr := strconv.ParseUint(v, 10, 63)
		switch {
		case perr != nil:
			bad("entry %q: DecodeFields accepted it, but Field(created_at) = %q is not a non-negative decimal integer", fields, v)
		case n == 0 && !job.CreatedAt.Equal(attack31EntryTime):
			bad("entry %q: Field(created_at) = 0 but Job.CreatedAt = %v, want the entry ID's time", fields, job.CreatedAt)
		case n != 0 && job.CreatedAt.UnixMilli() != int64(n):
			bad("entry %q: Field(created_at) = %q but Job.CreatedAt is %d ms", fields, v, job.CreatedAt.UnixMilli())
		}
	}
	if v := fv(stream.FieldFirstFailedAt); v == "" {
		if !job.FirstFailedAt.IsZero() {
			bad("entry %q: Field(first_failed_at) = \"\" but Job.FirstFailedAt = %v", fields, job.FirstFailedAt)
		}
	} else if n, perr := strconv.ParseInt(v, 10, 64); perr == nil && n > 0 && n < 1e15 && job.FirstFailedAt.UnixMilli() != n {
		bad("entry %q: Field(first_failed_at) = %q but Job.FirstFailedAt is %d ms", fields, v, job.FirstFailedAt.UnixMilli())
	}

	// error_history: a JSON array of strings; empty or absent means none.
	if v := fv(stream.FieldErrorHistory); v == "" {
		if len(job.ErrorHistory) != 0 {
			bad("entry %q: Field(error_history) = \"\" but Job.ErrorHistory = %q", fields, job.ErrorHistory)
		}
	} else {
		var want []string
		if jerr := json.Unmarshal([]byte(v), &want); jerr != nil {
			bad("entry %q: DecodeFields accepted it, but Field(error_history) = %q is not a JSON array of strings: %v", fields, v, jerr)
		} else if !slices.Equal(want, job.ErrorHistory) && (len(want) != 0 || len(job.ErrorHistory) != 0) {
			bad("entry %q: Field(error_history) = %q but Job.ErrorHistory = %q", fields, v, job.ErrorHistory)
		}
	}

	// Flags: "1" sets them, absent or empty leaves them unset.
	for _, c := range []struct {
		name string
		job  bool
	}{
		{stream.FieldSuspect, job.Suspect},
		{stream.FieldTrack, job.Track},
	} {
		switch fv(c.name) {
		case "1":
			if !c.job {
				bad("entry %q: Field(%s) = \"1\" but the Job's flag is false", fields, c.name)
			}
		case "":
			if c.job {
				bad("entry %q: Field(%s) = \"\" but the Job's flag is true", fields, c.name)
			}
		}
	}

	// Headers and unknown fields, both ways.
	for i := 0; i < len(fields); i += 2 {
		name := fields[i]
		switch {
		case attack31IsOwn(name):
		case strings.HasPrefix(name, stream.HeaderPrefix):
			if h := name[len(stream.HeaderPrefix):]; h != "" && job.Headers[h] != fv(name) {
				bad("entry %q: Field(%q) = %q but Job.Headers[%q] = %q", fields, name, fv(name), h, job.Headers[h])
			}
		default:
			if job.Extra[name] != fv(name) {
				bad("entry %q: Field(%q) = %q but Job.Extra[%q] = %q", fields, name, fv(name), name, job.Extra[name])
			}
		}
	}
	for h, v := range job.Headers {
		name := stream.HeaderPrefix + h
		if !present(name) || fv(name) != v {
			bad("entry %q: Job.Headers[%q] = %q but Field(%q) = %q (present %v)", fields, h, v, name, fv(name), present(name))
		}
	}
	for k, v := range job.Extra {
		if attack31IsOwn(k) || strings.HasPrefix(k, stream.HeaderPrefix) && len(k) > len(stream.HeaderPrefix) {
			bad("entry %q: Job.Extra holds %q, a name of the format or a header", fields, k)
		}
		if !present(k) || fv(k) != v {
			bad("entry %q: Job.Extra[%q] = %q but Field(%q) = %q (present %v)", fields, k, v, k, fv(k), present(k))
		}
	}
	return true, problems
}

// TestAttack31FieldCases pins hand-written expectations (not derived from the model), so that a
// wrong model cannot hide a wrong Field.
func TestAttack31FieldCases(t *testing.T) {
	t.Parallel()
	long := []string{"type", "t"}
	for i := range 3000 {
		long = append(long, "h.n"+strconv.Itoa(i%1500), strconv.Itoa(i))
	}
	for _, c := range []struct {
		fields []string
		name   string
		want   string
	}{
		{nil, "type", ""},
		{[]string{}, "", ""},
		{[]string{"type", "a", "type", "b"}, "type", "b"},
		{[]string{"type", "a", "payload", "{}", "type", "b", "payload", ""}, "payload", ""},
		{[]string{"payload", "type", "type", "t"}, "type", "t"},
		{[]string{"payload", "type", "type", "t"}, "payload", "type"},
		{[]string{"type", "t", "x", "type"}, "type", "t"},
		{[]string{"type", "t", "x", "type"}, "x", "type"},
		{[]string{"x", "type"}, "type", ""},
		{[]string{"type", "t", "job_id", "j", "job_id", ""}, "job_id", ""},
		{[]string{"Type", "X", "type", "t"}, "Type", "X"},
		{[]string{"Type", "X", "type", "t"}, "type", "t"},
		{[]string{"Type", "X", "type", "t"}, "TYPE", ""},
		{[]string{"h.a", "1", "h.A", "2", "type", "t", "h.a", "3"}, "h.a", "3"},
		{[]string{"h.a", "1", "h.A", "2", "type", "t", "h.a", "3"}, "h.A", "2"},
		{[]string{"h.a", "1", "type", "t"}, "a", ""},
		{[]string{"", "e", "type", "t"}, "", "e"},
		{[]string{"type", "t", "\xff\x00", "\x00\xff"}, "\xff\x00", "\x00\xff"},
		{[]string{"type", "t", "\xff\x00", "\x00\xff"}, "\xff", ""},
		{[]string{"type", "t", "typ", "p", "types", "s"}, "type", "t"},
		{[]string{"typ", "p", "types", "s"}, "type", ""},
		{long, "h.n7", "1507"},
		{long, "type", "t"},
	} {
		got, err := attack31Field(c.fields, c.name)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if got != c.want {
			t.Errorf("Field(%q, %q) = %q, want %q", c.fields, c.name, got, c.want)
		}
	}

	// Decoded jobs of tricky entries, by hand.
	for _, c := range []struct {
		fields []string
		check  func(j *stream.Job) bool
	}{
		{[]string{"type", "t", "job_id", "j", "job_id", ""}, func(j *stream.Job) bool { return j.ID == attack31EntryID }},
		{[]string{"type", "t", "created_at", "5", "created_at", "0"}, func(j *stream.Job) bool { return j.CreatedAt.Equal(attack31EntryTime) }},
		{[]string{"type", "t", "content_type", stream.ContentTypeMsgpack, "content_type", ""}, func(j *stream.Job) bool {
			return j.ContentType == "" || j.ContentType == stream.ContentTypeJSON
		}},
		{[]string{"Type", "X", "type", "t"}, func(j *stream.Job) bool { return j.Type == "t" && j.Extra["Type"] == "X" }},
		{[]string{"h.a", "1", "h.A", "2", "type", "t", "h.a", "3"}, func(j *stream.Job) bool { return j.Headers["a"] == "3" && j.Headers["A"] == "2" }},
		{[]string{"payload", "type", "type", "t"}, func(j *stream.Job) bool { return j.Type == "t" && string(j.Payload) == "type" }},
	} {
		job, err := stream.DecodeFields(attack31EntryID, c.fields, 0)
		if err != nil || !c.check(job) {
			t.Errorf("DecodeFields(%q) = %+v, %v: not the job the docs describe", c.fields, job, err)
		}
		if _, problems := attack31Check(c.fields); len(problems) > 0 {
			t.Errorf("%s", strings.Join(problems, "\n"))
		}
	}

	// Odd counts: the godoc of Field is silent, so no panic is all that is asked.
	for _, f := range [][]string{
		{"type"}, {""}, {"type", "t", "payload"}, {"a", "type", "type"}, {"type", "t", "type"},
		{"x", "type", "type"}, {"\xff"},
	} {
		for _, name := range append(slices.Clone(attack31Probe), f...) {
			if _, err := attack31Field(f, name); err != nil {
				t.Errorf("%v", err)
			}
		}
		if _, problems := attack31Check(f); len(problems) > 0 {
			t.Errorf("%s", strings.Join(problems, "\n"))
		}
	}
}

// attack31Gen builds random entries from a vocabulary that favours duplicates, empty values,
// values equal to names, case variants and binary bytes.
type attack31Gen struct{ r *rand.Rand }

var attack31Names = []string{
	"type", "payload", "v", "job_id", "idempotency_key", "attempt", "max_attempts", "created_at",
	"lock_key", "content_type", "traceparent", "tracestate", "last_error", "error_history",
	"first_failed_at", "suspect", "track",
	"Type", "TYPE", "Payload", "V", "Job_ID", "ATTEMPT", "Track", "Content_Type",
	"h.tenant", "h.Tenant", "h.TENANT", "H.tenant", "h.a", "h.A", "h.h.a", "h. ", "h.\x00", "h.\xff\xfe", "h.type", "h.",
	"origin", "x", "", "\x00", "\xff\xfe", "type ", " type", "type\x00", "typ", "types", "h",
	"replayed_from", "replay_count", "dead_reason", "dead_error",
}

func (g attack31Gen) pick(s []string) string { return s[g.r.IntN(len(s))] }

func (g attack31Gen) binary() string {
	b := make([]byte, g.r.IntN(8))
	for i := range b {
		b[i] = byte(g.r.IntN(256))
	}
	return string(b)
}

func (g attack31Gen) value(name string) string {
	if g.r.IntN(8) == 0 {
		switch g.r.IntN(4) {
		case 0:
			return ""
		case 1:
			return g.binary()
		default:
			return g.pick(attack31Names) // a value equal to a name
		}
	}
	switch name {
	case "type":
		return g.pick([]string{"t", "email.send", "\xff\x00t", "type", "payload"})
	case "v":
		return g.pick([]string{"1", "1", "1", "", "2", "01"})
	case "attempt", "max_attempts":
		return g.pick([]string{"0", "3", "007", "9223372036854775807", "", "-1", "abc", "9223372036854775808", "1e3"})
	case "created_at":
		return g.pick([]string{"0", "1", "1700000000123", "1800000000000", "", "x", "+5"})
	case "first_failed_at":
		return g.pick([]string{"", "1700000000999", "1"})
	case "content_type":
		return g.pick([]string{"", stream.ContentTypeJSON, stream.ContentTypeMsgpack, "text/plain", "Application/JSON"})
	case "error_history":
		return g.pick([]string{"", `[]`, `["a","b"]`, `["\u0000","é"]`, `not json`, `[1]`})
	case "suspect", "track":
		return g.pick([]string{"1", "", "1"})
	default:
		switch g.r.IntN(3) {
		case 0:
			return g.binary()
		case 1:
			return g.pick(attack31Names)
		default:
			return strconv.Itoa(g.r.IntN(1000))
		}
	}
}

func (g attack31Gen) entry() []string {
	var f []string
	n := g.r.IntN(10)
	for range n {
		var name string
		if len(f) > 0 && g.r.IntN(3) == 0 {
			name = f[2*g.r.IntN(len(f)/2)] // a duplicate name
		} else {
			name = g.pick(attack31Names)
		}
		f = append(f, name, g.value(name))
	}
	if g.r.IntN(10) < 7 { // mostly a valid type somewhere, so that many entries decode
		at := 2 * g.r.IntN(len(f)/2+1)
		f = slices.Insert(f, at, "type", g.pick([]string{"t", "email.send", "\x00"}))
	}
	if g.r.IntN(10) == 0 { // sometimes an odd count
		if len(f) > 0 && g.r.IntN(2) == 0 {
			f = f[:len(f)-1]
		} else {
			f = append(f, g.pick(attack31Names))
		}
	}
	return f
}

// TestAttack31FieldRandom compares Field with the model and with DecodeFields on random entries.
func TestAttack31FieldRandom(t *testing.T) {
	t.Parallel()
	g := attack31Gen{rand.New(rand.NewPCG(31, 0x5eed))}
	const runs = 20000
	decoded, odd, dups := 0, 0, 0
	start := time.Now()
	for range runs {
		f := g.entry()
		if len(f)%2 != 0 {
			odd++
		} else {
			seen := map[string]bool{}
			for i := 0; i < len(f); i += 2 {
				if seen[f[i]] {
					dups++
					break
				}
				seen[f[i]] = true
			}
		}
		ok, problems := attack31Check(f)
		if ok {
			decoded++
		}
		if len(problems) > 0 {
			t.Fatalf("%s", strings.Join(problems, "\n"))
		}
	}
	// The run must exercise the comparison with the decoder, duplicates and odd counts.
	if decoded < runs/5 || odd < runs/50 || dups < runs/5 {
		t.Fatalf("weak run: %d of %d entries decoded, %d odd, %d with duplicate names", decoded, runs, odd, dups)
	}
	t.Logf("%d entries in %v: %d decoded, %d odd, %d with duplicate names", runs, time.Since(start), decoded, odd, dups)
}

// FuzzAttack31Field: raw is split at sep into the entry's elements (names and values in turn);
// withType puts a valid type first, so that more entries decode (a later "type" still wins).
func FuzzAttack31Field(f *testing.F) {
	join := func(parts ...string) []byte { return []byte(strings.Join(parts, "\x00")) }
	for _, s := range [][]byte{
		join("type", "a", "type", "b"),
		join("payload", "type", "type", "t"),
		join("type", "t", "x", "type"),
		join("type", "t", "job_id", "j", "job_id", ""),
		join("type", "t", "created_at", "5", "created_at", "0"),
		join("type", "t", "content_type", "application/msgpack", "content_type", ""),
		join("Type", "X", "type", "t", "TYPE", "Y"),
		join("h.a", "1", "h.A", "2", "type", "t", "h.a", "3", "H.a", "4"),
		join("type", "t", "origin", "o", "origin", "", "replayed_from", "1-1", "replay_count", "2"),
		join("type", "t", "attempt", "3", "attempt", "007", "max_attempts", "5", "v", "1"),
		join("type", "t", "error_history", `["a"]`, "error_history", `["b","c"]`),
		join("type", "t", "suspect", "1", "track", "1", "track", ""),
		join("type", "t", "payload"),
		join("type"),
		join(""),
		join("", "", "type", "t"),
		join("type", "t", "h.", "x", "h.h.", "y"),
		join("type", "t", "dead_reason", "malformed", "first_failed_at", "1700000000999"),
		{0xff, 0xfe, 0x00, 0x80, 0x00, 't', 'y', 'p', 'e', 0x00, 0xc3, 0x28},
	} {
		f.Add(s, byte(0), false)
		f.Add(s, byte(0), true)
	}
	f.Add([]byte("type|t|\x00bin\x00|\xff"), byte('|'), false)
	f.Add([]byte("h.\x00a|1|h.\x00a|2"), byte('|'), true)

	f.Fuzz(func(t *testing.T, raw []byte, sep byte, withType bool) {
		fields := strings.Split(string(raw), string([]byte{sep}))
		if len(raw) == 0 {
			fields = nil
		}
		if withType {
			fields = append([]string{"type", "t"}, fields...)
		}
		if _, problems := attack31Check(fields); len(problems) > 0 {
			t.Fatalf("%s", strings.Join(problems, "\n"))
		}
		// The same entry with a valid type appended: it always decodes unless another field is
		// wrong, and the last type wins.
		if len(fields)%2 == 0 {
			more := append(slices.Clone(fields), "type", "last")
			if _, problems := attack31Check(more); len(problems) > 0 {
				t.Fatalf("%s", strings.Join(problems, "\n"))
			}
			if got := stream.Field(more, "type"); got != "last" {
				t.Fatalf("Field(%q, \"type\") = %q, want \"last\"", more, got)
			}
		}
	})
}
