package stream_test

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/stream"
)

// Fuzz input encoding: data is split at NUL bytes into alternating field names
// and values. A value that starts with 0x01 becomes a []byte and one that is
// exactly "\x02" becomes nil, so that non-string values (what a careless
// caller, not Redis, might pass) are fuzzed too. A repeated name keeps its
// last value, as go-redis does.
const (
	fuzzSep      = "\x00"
	fuzzBytes    = "\x01"
	fuzzNilValue = "\x02"
)

func fuzzFields(data []byte) map[string]any {
	parts := strings.Split(string(data), fuzzSep)
	m := make(map[string]any, len(parts)/2)
	for i := 0; i+1 < len(parts); i += 2 {
		name, v := parts[i], parts[i+1]
		switch {
		case v == fuzzNilValue:
			m[name] = nil
		case strings.HasPrefix(v, fuzzBytes):
			m[name] = []byte(v[1:])
		default:
			m[name] = v
		}
	}
	return m
}

// fuzzEntry is the inverse of fuzzFields for string values.
func fuzzEntry(pairs ...string) []byte {
	return []byte(strings.Join(pairs, fuzzSep))
}

func FuzzDecode(f *testing.F) {
	full := &stream.Job{
		ID: "0190a6e2-0000-7000-8000-000000000001", Type: "email.send", Payload: []byte{0x81, 0xa2, 't', 'o'},
		ContentType: stream.ContentTypeMsgpack, IdempotencyKey: "k", Attempt: 2, MaxAttempts: 5,
		LockKey: "l", TraceParent: "tp", TraceState: "ts", LastError: "boom",
		Headers: map[string]string{"a": "1"}, Extra: map[string]string{"new": "x"},
	}
	var encoded []string
	for _, v := range stream.Encode(full) {
		switch v := v.(type) {
		case string:
			encoded = append(encoded, v)
		case []byte:
			encoded = append(encoded, string(v))
		}
	}

	seeds := []struct {
		id   string
		data []byte
	}{
		{"1700000000000-0", fuzzEntry(encoded...)},
		{"1700000000000-0", fuzzEntry("type", "t", "payload", `{"a":1}`)},
		{"1700000000000-0", nil},
		{"", fuzzEntry("type", "t")},
		{"junk", fuzzEntry("type", "t")},
		{"18446744073709551615-18446744073709551615", fuzzEntry("type", "t")},
		{"9223372036854775807-0", fuzzEntry("type", "t")},
		{"1-0", []byte{0xff, 0xfe, 0x00, 0x80, 0x00, 't', 'y', 'p', 'e', 0x00, 0xc3, 0x28}},
		{"1-0", fuzzEntry("type", "")},
		{"1-0", fuzzEntry("payload", "x")},
		{"1-0", fuzzEntry("type", "t", "attempt", "99999999999999999999999")},
		{"1-0", fuzzEntry("type", "t", "attempt", "9223372036854775807")},
		{"1-0", fuzzEntry("type", "t", "max_attempts", "-0")},
		{"1-0", fuzzEntry("type", "t", "attempt", "+7")},
		{"1-0", fuzzEntry("type", "t", "created_at", "9223372036854775807")},
		{"1-0", fuzzEntry("type", "t", "created_at", "0")},
		{"1-0", fuzzEntry("type", "t", "created_at", "1.5")},
		{"1-0", fuzzEntry("type", "t", "h.", "bare")},
		{"1-0", fuzzEntry("type", "t", "h.", "")},
		{"1-0", fuzzEntry("type", "t", "h.h.", "nested")},
		{"1-0", fuzzEntry("type", "t", "v", "2")},
		{"1-0", fuzzEntry("type", "t", "v", "1", "v", "2")},
		{"1-0", fuzzEntry("type", "t", "payload", fuzzBytes+"raw")},
		{"1-0", fuzzEntry("type", fuzzNilValue)},
		{"1-0", fuzzEntry("", "", "type", "t")},
		{"1-0", fuzzEntry("type", "t", "content_type", "")},
		{"1-0", fuzzEntry("type", "t", "job_id", "")},
		{"1-0", fuzzEntry("type", "t", "payload", strings.Repeat("\xff", 4096))},
	}
	for _, s := range seeds {
		f.Add(s.id, s.data)
	}

	f.Fuzz(func(t *testing.T, id string, data []byte) {
		fields := fuzzFields(data)
		job, err := stream.Decode(id, fields)
		checkSameAsPairs(t, id, fields, job, err)
		if err != nil {
			checkFuzzError(t, id, fields, job, err)
			return
		}
		if job == nil {
			t.Fatal("Decode returned nil, nil")
		}
		if job.Type == "" {
			t.Fatalf("Decode accepted a job with an empty Type: %+v", job)
		}
		if job.EntryID != id {
			t.Errorf("EntryID = %q, want %q", job.EntryID, id)
		}
		if job.ContentType == "" {
			t.Error("ContentType is empty; want the JSON default")
		}
		if want, ok := fields[stream.FieldJobID].(string); ok && want != "" {
			if job.ID != want {
				t.Errorf("ID = %q, want job_id %q", job.ID, want)
			}
		} else if job.ID != id {
			t.Errorf("ID = %q, want the entry ID %q", job.ID, id)
		}
		if p, ok := fields[stream.FieldPayload].(string); ok && !bytes.Equal(job.Payload, []byte(p)) {
			t.Errorf("Payload = %q, want %q", job.Payload, p)
		}

		// Round trip: what the consumer re-enqueues on a retry decodes to the same job.
		again, err := stream.Decode(id, wireFields(t, stream.Encode(job)))
		if err != nil {
			t.Fatalf("Decode(Encode(job)) error: %v\njob: %+v", err, job)
		}
		for _, d := range jobDiff(again, job, false) {
			t.Error("after a round trip:", d)
		}
	})
}

func checkFuzzError(t *testing.T, id string, fields map[string]any, job *stream.Job, err error) {
	t.Helper()
	if job != nil {
		t.Errorf("Decode returned a job with error %v", err)
	}
	var de *stream.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %v is a %T, want *stream.DecodeError", err, err)
	}
	if de.EntryID != id {
		t.Errorf("DecodeError.EntryID = %q, want %q", de.EntryID, id)
	}
	if de.Reason == "" {
		t.Error("DecodeError.Reason is empty")
	}
	switch _, present := fields[de.Field]; {
	case de.Field == "":
		// Either the entry as a whole, or a field whose name is empty (Redis
		// allows that name).
		if len(fields) != 0 && !present {
			t.Errorf("DecodeError names no field for an entry with %d fields: %v", len(fields), err)
		}
	case !present && de.Field != stream.FieldType:
		t.Errorf("DecodeError names field %q, which the entry does not have", de.Field)
	default:
		if !strings.Contains(err.Error(), "field "+strconv.Quote(de.Field)) {
			t.Errorf("message %q does not name field %q", err.Error(), de.Field)
		}
	}
}

// checkSameAsPairs checks that DecodeFields decodes fields, given as pairs
// in either name order or each name twice (a junk value first), as Decode
// did (job, err), when every value is a string.
func checkSameAsPairs(t *testing.T, id string, fields map[string]any, job *stream.Job, err error) {
	t.Helper()
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v, ok := fields[k].(string)
		if !ok {
			return
		}
		pairs = append(pairs, k, v)
	}
	reversed := make([]string, 0, len(pairs))
	for i := len(pairs) - 2; i >= 0; i -= 2 {
		reversed = append(reversed, pairs[i], pairs[i+1])
	}
	// Each name given twice, a junk value first: the last value counts.
	doubled := make([]string, 0, 2*len(pairs))
	for i := 0; i < len(pairs); i += 2 {
		doubled = append(doubled, pairs[i], "\x00junk", pairs[i], pairs[i+1])
	}
	for _, p := range [][]string{pairs, reversed, doubled} {
		got, gotErr := stream.DecodeFields(id, p, stream.DefaultMaxEntryBytes)
		if (err == nil) != (gotErr == nil) || (err != nil && err.Error() != gotErr.Error()) {
			t.Fatalf("DecodeFields(%q) error %v; Decode of the map: %v", p, gotErr, err)
		}
		if err == nil {
			for _, d := range jobDiff(got, job, true) {
				t.Errorf("DecodeFields(%q): %s", p, d)
			}
		}
	}
}
