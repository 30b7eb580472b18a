package stream_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// entryID is the stream entry ID the codec tests decode with; its time part
// is entryTime.
const entryID = "1700000000000-7"

var entryTime = time.UnixMilli(1700000000000)

// wireFields turns Encode's alternating names and values into the map go-redis
// returns in redis.XMessage.Values after a round trip through Redis: every
// name and value a string, and a repeated name keeping its last value.
func wireFields(t testing.TB, args []any) map[string]any {
	t.Helper()
	if len(args)%2 != 0 {
		t.Fatalf("Encode returned %d items, want name/value pairs", len(args))
	}
	m := make(map[string]any, len(args)/2)
	for i := 0; i < len(args); i += 2 {
		m[wireString(t, args[i])] = wireString(t, args[i+1])
	}
	return m
}

func wireString(t testing.TB, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	default:
		t.Fatalf("Encode returned a %T (%v); want string or []byte", v, v)
		return ""
	}
}

// jobDiff lists the fields in which got differs from want, delivery fields
// (EntryID, Stream, Deliveries) included only when withDelivery is set. Nil and
// empty payloads, headers and extras are equal, as they are on the wire.
func jobDiff(got, want *stream.Job, withDelivery bool) []string {
	var d []string
	cmp := func(name string, g, w any) {
		if g != w {
			d = append(d, fmt.Sprintf("%s = %#v, want %#v", name, g, w))
		}
	}
	cmp("ID", got.ID, want.ID)
	cmp("Type", got.Type, want.Type)
	if !bytes.Equal(got.Payload, want.Payload) {
		d = append(d, fmt.Sprintf("Payload = %q, want %q", got.Payload, want.Payload))
	}
	cmp("ContentType", got.ContentType, want.ContentType)
	cmp("IdempotencyKey", got.IdempotencyKey, want.IdempotencyKey)
	cmp("Attempt", got.Attempt, want.Attempt)
	cmp("MaxAttempts", got.MaxAttempts, want.MaxAttempts)
	if !got.CreatedAt.Equal(want.CreatedAt) {
		d = append(d, fmt.Sprintf("CreatedAt = %v, want %v", got.CreatedAt, want.CreatedAt))
	}
	cmp("LockKey", got.LockKey, want.LockKey)
	cmp("TraceParent", got.TraceParent, want.TraceParent)
	cmp("TraceState", got.TraceState, want.TraceState)
	cmp("LastError", got.LastError, want.LastError)
	if !maps.Equal(got.Headers, want.Headers) {
		d = append(d, fmt.Sprintf("Headers = %v, want %v", got.Headers, want.Headers))
	}
	if !maps.Equal(got.Extra, want.Extra) {
		d = append(d, fmt.Sprintf("Extra = %v, want %v", got.Extra, want.Extra))
	}
	if withDelivery {
		cmp("EntryID", got.EntryID, want.EntryID)
		cmp("Stream", got.Stream, want.Stream)
		cmp("Deliveries", got.Deliveries, want.Deliveries)
	}
	return d
}

func TestEncode_roundTrip(t *testing.T) {
	t.Parallel()

	created := time.UnixMilli(1690000000123)
	tests := []struct {
		name string
		job  *stream.Job
		want *stream.Job // the decoded job; delivery fields included
	}{
		{
			name: "AllFields",
			job: &stream.Job{
				ID:             "0190a6e2-0000-7000-8000-000000000001",
				Type:           "email.send",
				Payload:        []byte{0x81, 0xa2, 't', 'o', 0x00, 0xff},
				ContentType:    stream.ContentTypeMsgpack,
				IdempotencyKey: "order-42",
				Attempt:        3,
				MaxAttempts:    10,
				CreatedAt:      created,
				LockKey:        "customer:7",
				TraceParent:    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				TraceState:     "congo=t61rcWkgMzE",
				LastError:      "smtp: 451 try later",
				Headers:        map[string]string{"tenant": "acme", "b": "", "with.dot": "x"},
				Extra:          map[string]string{"future_field": "1", "h.": "bare prefix", "x": ""},
				// Delivery fields are never written.
				EntryID:    "1-1",
				Stream:     "other",
				Deliveries: 9,
			},
			want: &stream.Job{
				ID:             "0190a6e2-0000-7000-8000-000000000001",
				Type:           "email.send",
				Payload:        []byte{0x81, 0xa2, 't', 'o', 0x00, 0xff},
				ContentType:    stream.ContentTypeMsgpack,
				IdempotencyKey: "order-42",
				Attempt:        3,
				MaxAttempts:    10,
				CreatedAt:      created,
				LockKey:        "customer:7",
				TraceParent:    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				TraceState:     "congo=t61rcWkgMzE",
				LastError:      "smtp: 451 try later",
				Headers:        map[string]string{"tenant": "acme", "b": "", "with.dot": "x"},
				Extra:          map[string]string{"future_field": "1", "h.": "bare prefix", "x": ""},
				EntryID:        entryID,
			},
		},
		{
			name: "Defaults",
			job:  &stream.Job{Type: "t"},
			want: &stream.Job{
				ID:          entryID, // job_id absent: the entry ID
				Type:        "t",
				ContentType: stream.ContentTypeJSON, // content_type absent: JSON
				CreatedAt:   entryTime,              // created_at absent: the entry's time
				EntryID:     entryID,
			},
		},
		{
			name: "ZeroCreatedAtIsEntryTime",
			job:  &stream.Job{Type: "t", ID: "j", Payload: []byte(`{"a":1}`), ContentType: stream.ContentTypeJSON},
			want: &stream.Job{
				ID:          "j",
				Type:        "t",
				Payload:     []byte(`{"a":1}`),
				ContentType: stream.ContentTypeJSON,
				CreatedAt:   entryTime,
				EntryID:     entryID,
			},
		},
		{
			name: "Epoch",
			job:  &stream.Job{Type: "t", CreatedAt: time.UnixMilli(0)},
			want: &stream.Job{
				ID:          entryID,
				Type:        "t",
				ContentType: stream.ContentTypeJSON,
				CreatedAt:   entryTime, // created_at 0 means absent: the entry's time
				EntryID:     entryID,
			},
		},
		{
			name: "NegativeCountsAreNotWritten",
			job:  &stream.Job{Type: "t", Attempt: -1, MaxAttempts: -5},
			want: &stream.Job{
				ID:          entryID,
				Type:        "t",
				ContentType: stream.ContentTypeJSON,
				CreatedAt:   entryTime,
				EntryID:     entryID,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, err := stream.Decode(entryID, wireFields(t, stream.Encode(tt.job)))
			if err != nil {
				t.Fatalf("Decode(Encode(job)) error: %v", err)
			}
			for _, d := range jobDiff(got, tt.want, true) {
				t.Error(d)
			}
		})
	}
}

func TestEncode(t *testing.T) {
	t.Parallel()

	t.Run("WritesOnlyNonDefaults", func(t *testing.T) {
		t.Parallel()

		got := stream.Encode(&stream.Job{Type: "t", EntryID: "1-1", Stream: "s", Deliveries: 3})
		want := []any{stream.FieldVersion, "1", stream.FieldType, "t", stream.FieldPayload, []byte(nil)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Encode = %v, want %v", got, want)
		}
	})

	t.Run("LeavesOutDefaultContentType", func(t *testing.T) {
		t.Parallel()

		// JSON is what an absent content_type means: a retried JSON job
		// carries one field fewer. Any other content type is written.
		got := stream.Encode(&stream.Job{Type: "t", ContentType: stream.ContentTypeJSON})
		if slices.Contains(got, any(stream.FieldContentType)) {
			t.Errorf("Encode(JSON) = %v, want no %s", got, stream.FieldContentType)
		}
		got = stream.Encode(&stream.Job{Type: "t", ContentType: stream.ContentTypeMsgpack})
		if i := slices.Index(got, any(stream.FieldContentType)); i < 0 || got[i+1] != any(stream.ContentTypeMsgpack) {
			t.Errorf("Encode(msgpack) = %v, want %s %s", got, stream.FieldContentType, stream.ContentTypeMsgpack)
		}
	})

	t.Run("AppendEncodeAppends", func(t *testing.T) {
		t.Parallel()

		j := &stream.Job{Type: "t", ID: "j", Attempt: 2, Headers: map[string]string{"a": "1"}}
		prefix := []any{"id", 0, "", 0}
		got := stream.AppendEncode(prefix[:4:4], j)
		want := append([]any{"id", 0, "", 0}, stream.Encode(j)...)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("AppendEncode = %v, want %v", got, want)
		}
	})

	t.Run("SortsHeadersAndExtra", func(t *testing.T) {
		t.Parallel()

		j := &stream.Job{
			Type:    "t",
			Headers: map[string]string{"c": "3", "a": "1", "b": "2"},
			Extra:   map[string]string{"z": "26", "m": "13"},
		}
		f := stream.Encode(j)
		var names []string
		for i := 6; i < len(f); i += 2 { // after v, type, payload
			names = append(names, f[i].(string))
		}
		if got, want := strings.Join(names, " "), "h.a h.b h.c m z"; got != want {
			t.Errorf("field names after the fixed ones = %q, want %q", got, want)
		}
	})

	t.Run("ExtraCannotShadowFields", func(t *testing.T) {
		t.Parallel()

		// Decode never fills Extra with these names; a caller might.
		j := &stream.Job{
			Type:    "email.send",
			Headers: map[string]string{"a": "real"},
			Extra: map[string]string{
				"type": "evil.reroute", "v": "2", "job_id": "other", "attempt": "x",
				"h.a": "shadow", "h.b": "smuggled", "h.": "kept", "unknown": "kept",
			},
		}
		f := stream.Encode(j)
		seen := map[string]int{}
		for i := 0; i < len(f); i += 2 {
			seen[f[i].(string)]++
		}
		for name, n := range seen {
			if n > 1 {
				t.Errorf("Encode wrote field %q %d times", name, n)
			}
		}
		got, err := stream.Decode(entryID, wireFields(t, f))
		if err != nil {
			t.Fatalf("Decode(Encode(job)) error: %v", err)
		}
		want := &stream.Job{
			ID: entryID, Type: "email.send", ContentType: stream.ContentTypeJSON, CreatedAt: entryTime,
			Headers: map[string]string{"a": "real"},
			Extra:   map[string]string{"h.": "kept", "unknown": "kept"},
		}
		for _, d := range jobDiff(got, want, false) {
			t.Error(d)
		}
	})

	t.Run("VersionField", func(t *testing.T) {
		t.Parallel()

		f := wireFields(t, stream.Encode(&stream.Job{Type: "t"}))
		if got, want := f[stream.FieldVersion], strconv.Itoa(stream.Version); got != want {
			t.Errorf("field %q = %v, want %q", stream.FieldVersion, got, want)
		}
	})
}

func TestDecode(t *testing.T) {
	t.Parallel()

	t.Run("ForeignMinimalEntry", func(t *testing.T) {
		t.Parallel()

		// What `XADD jobs * type email.send payload {...}` from redis-cli gives.
		got, err := stream.Decode(entryID, map[string]any{
			"type":    "email.send",
			"payload": `{"to":"a@example.com"}`,
		})
		if err != nil {
			t.Fatalf("Decode error: %v", err)
		}
		want := &stream.Job{
			ID:          entryID,
			Type:        "email.send",
			Payload:     []byte(`{"to":"a@example.com"}`),
			ContentType: stream.ContentTypeJSON,
			CreatedAt:   entryTime,
			EntryID:     entryID,
		}
		for _, d := range jobDiff(got, want, true) {
			t.Error(d)
		}
		if got.Attempt != 0 || got.MaxAttempts != 0 {
			t.Errorf("Attempt, MaxAttempts = %d, %d; want 0, 0", got.Attempt, got.MaxAttempts)
		}
	})

	t.Run("EntryIDWithoutTime", func(t *testing.T) {
		t.Parallel()

		got, err := stream.Decode("not-an-id", map[string]any{"type": "t"})
		if err != nil {
			t.Fatalf("Decode error: %v", err)
		}
		if !got.CreatedAt.IsZero() {
			t.Errorf("CreatedAt = %v, want the zero Time for an entry ID without a time", got.CreatedAt)
		}
		if got.ID != "not-an-id" {
			t.Errorf("ID = %q, want the entry ID", got.ID)
		}
	})

	t.Run("AcceptedNumbers", func(t *testing.T) {
		t.Parallel()

		got, err := stream.Decode(entryID, map[string]any{
			"type": "t", "v": "1", "attempt": "0", "max_attempts": "007", "created_at": "1690000000123",
		})
		if err != nil {
			t.Fatalf("Decode error: %v", err)
		}
		if got.Attempt != 0 || got.MaxAttempts != 7 || !got.CreatedAt.Equal(time.UnixMilli(1690000000123)) {
			t.Errorf("Attempt, MaxAttempts, CreatedAt = %d, %d, %v; want 0, 7, %v",
				got.Attempt, got.MaxAttempts, got.CreatedAt, time.UnixMilli(1690000000123))
		}
	})

	t.Run("WithinLimit", func(t *testing.T) {
		t.Parallel()

		f := map[string]any{"type": "t", "payload": strings.Repeat("x", 100)}
		size := len("type") + len("t") + len("payload") + 100
		if _, err := stream.DecodeLimit(entryID, f, size); err != nil {
			t.Errorf("DecodeLimit(limit = size %d) error: %v", size, err)
		}
		if _, err := stream.DecodeLimit(entryID, f, 0); err != nil {
			t.Errorf("DecodeLimit(limit 0 = none) error: %v", err)
		}
		if _, err := stream.DecodeLimit(entryID, f, -1); err != nil {
			t.Errorf("DecodeLimit(limit -1 = none) error: %v", err)
		}
	})
}

func TestDecode_errors(t *testing.T) {
	t.Parallel()

	long := strings.Repeat("9", 40) + strings.Repeat("x", 200)
	tests := []struct {
		name       string
		fields     map[string]any
		limit      int // 0: Decode; otherwise DecodeLimit with this limit
		wantField  string
		wantReason string // a substring of Reason
	}{
		{name: "EmptyEntry", fields: map[string]any{}, wantField: "", wantReason: "no fields"},
		{name: "NilEntry", fields: nil, wantField: "", wantReason: "no fields"},
		{name: "NoType", fields: map[string]any{"payload": "{}"}, wantField: "type", wantReason: "missing"},
		{name: "EmptyType", fields: map[string]any{"type": "", "payload": "{}"}, wantField: "type", wantReason: "empty"},
		{name: "AttemptWord", fields: map[string]any{"type": "t", "attempt": "abc"}, wantField: "attempt", wantReason: `"abc"`},
		{name: "AttemptNegative", fields: map[string]any{"type": "t", "attempt": "-1"}, wantField: "attempt", wantReason: `"-1"`},
		{name: "AttemptFraction", fields: map[string]any{"type": "t", "attempt": "1.5"}, wantField: "attempt", wantReason: `"1.5"`},
		{name: "AttemptEmpty", fields: map[string]any{"type": "t", "attempt": ""}, wantField: "attempt", wantReason: "non-negative"},
		{name: "AttemptSpace", fields: map[string]any{"type": "t", "attempt": " 1"}, wantField: "attempt", wantReason: "non-negative"},
		{name: "AttemptOverflow", fields: map[string]any{"type": "t", "attempt": "99999999999999999999"}, wantField: "attempt", wantReason: "non-negative"},
		{name: "AttemptLongValueCut", fields: map[string]any{"type": "t", "attempt": long}, wantField: "attempt", wantReason: `"...`},
		{name: "MaxAttemptsWord", fields: map[string]any{"type": "t", "max_attempts": "ten"}, wantField: "max_attempts", wantReason: `"ten"`},
		{name: "MaxAttemptsNegative", fields: map[string]any{"type": "t", "max_attempts": "-3"}, wantField: "max_attempts", wantReason: "non-negative"},
		{name: "MaxAttemptsExponent", fields: map[string]any{"type": "t", "max_attempts": "1e3"}, wantField: "max_attempts", wantReason: `"1e3"`},
		{name: "CreatedAtWord", fields: map[string]any{"type": "t", "created_at": "yesterday"}, wantField: "created_at", wantReason: `"yesterday"`},
		{name: "CreatedAtRFC3339", fields: map[string]any{"type": "t", "created_at": "2024-01-01T00:00:00Z"}, wantField: "created_at", wantReason: "non-negative"},
		{name: "CreatedAtNegative", fields: map[string]any{"type": "t", "created_at": "-5"}, wantField: "created_at", wantReason: "non-negative"},
		{name: "Version2", fields: map[string]any{"type": "t", "v": "2"}, wantField: "v", wantReason: "version"},
		{name: "VersionEmpty", fields: map[string]any{"type": "t", "v": ""}, wantField: "v", wantReason: "version"},
		{name: "NonStringBytes", fields: map[string]any{"type": "t", "payload": []byte("{}")}, wantField: "payload", wantReason: "[]uint8"},
		{name: "NonStringInt", fields: map[string]any{"type": 5}, wantField: "type", wantReason: "int"},
		{name: "NonStringNil", fields: map[string]any{"type": "t", "h.x": nil}, wantField: "h.x", wantReason: "<nil>"},
		{
			name:       "Oversize",
			fields:     map[string]any{"type": "t", "idempotency_key": "k", "payload": strings.Repeat("p", 200)},
			limit:      100,
			wantField:  "payload", // the biggest field
			wantReason: "over the limit of 100",
		},
		{
			name:       "OversizeByOneByte",
			fields:     map[string]any{"type": "t", "payload": strings.Repeat("p", 89)}, // 4+1+7+89 = 101
			limit:      100,
			wantField:  "payload",
			wantReason: "101 bytes",
		},
		{
			name:       "OversizeWithoutType",
			fields:     map[string]any{"payload": strings.Repeat("p", 200)},
			limit:      100,
			wantField:  "payload", // the size is checked before the type
			wantReason: "over the limit",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var (
				job *stream.Job
				err error
			)
			if tt.limit == 0 {
				job, err = stream.Decode(entryID, tt.fields)
			} else {
				job, err = stream.DecodeLimit(entryID, tt.fields, tt.limit)
			}
			if err == nil {
				t.Fatalf("Decode = %+v, nil; want a *DecodeError", job)
			}
			if job != nil {
				t.Errorf("Decode returned job %+v with error %v; want nil", job, err)
			}
			var de *stream.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is a %T, want *stream.DecodeError", err, err)
			}
			if de.Field != tt.wantField {
				t.Errorf("Field = %q, want %q (error: %v)", de.Field, tt.wantField, err)
			}
			if !strings.Contains(de.Reason, tt.wantReason) {
				t.Errorf("Reason = %q, want it to contain %q", de.Reason, tt.wantReason)
			}
			if de.EntryID != entryID {
				t.Errorf("EntryID = %q, want %q", de.EntryID, entryID)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "stream: entry "+entryID+": ") {
				t.Errorf("message %q does not start with the entry", msg)
			}
			if tt.wantField != "" && !strings.Contains(msg, "field "+strconv.Quote(tt.wantField)) {
				t.Errorf("message %q does not name field %q", msg, tt.wantField)
			}
			if len(msg) > 300 {
				t.Errorf("message is %d bytes long; a foreign value must be cut short: %q", len(msg), msg)
			}
		})
	}
}

func TestDecodeError_Error(t *testing.T) {
	t.Parallel()

	tests := []struct {
		err  *stream.DecodeError
		want string
	}{
		{
			err:  &stream.DecodeError{EntryID: "1-0", Field: "attempt", Reason: `not a non-negative decimal integer (got "abc")`},
			want: `stream: entry 1-0: field "attempt": not a non-negative decimal integer (got "abc")`,
		},
		{
			err:  &stream.DecodeError{EntryID: "1-0", Reason: "entry has no fields"},
			want: "stream: entry 1-0: entry has no fields",
		},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}

	// The message of a real decode failure names the field and its value.
	_, err := stream.Decode("5-0", map[string]any{"type": "t", "attempt": "abc"})
	if want := `stream: entry 5-0: field "attempt": not a non-negative decimal integer (got "abc")`; err == nil || err.Error() != want {
		t.Errorf("Decode error = %v, want %q", err, want)
	}
}

func TestEntryTime(t *testing.T) {
	t.Parallel()

	tests := []struct {
		id     string
		want   time.Time
		wantOK bool
	}{
		{"1700000000000-0", time.UnixMilli(1700000000000), true},
		{"1700000000000-18446744073709551615", time.UnixMilli(1700000000000), true},
		{"1700000000000", time.UnixMilli(1700000000000), true},
		{"0-1", time.UnixMilli(0), true},
		{"", time.Time{}, false},
		{"-1", time.Time{}, false},
		{"abc-0", time.Time{}, false},
		{"18446744073709551615-0", time.Time{}, false}, // beyond int64
	}
	for _, tt := range tests {
		got, ok := stream.EntryTime(tt.id)
		if ok != tt.wantOK || !got.Equal(tt.want) {
			t.Errorf("EntryTime(%q) = %v, %t; want %v, %t", tt.id, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestDecode_deterministicField: with several wrong fields, the error names
// the same one every time (the smallest name), whatever the map order.
func TestDecode_deterministicField(t *testing.T) {
	t.Parallel()
	fields := map[string]any{"v": "2", "attempt": "abc", "max_attempts": "+5", "type": "t", "created_at": "x"}
	for range 50 {
		_, err := stream.Decode(entryID, fields)
		var de *stream.DecodeError
		if !errors.As(err, &de) || de.Field != "attempt" {
			t.Fatalf("Decode error = %v, want field attempt", err)
		}
	}
	_, err := stream.DecodeLimit(entryID, map[string]any{"attempt": "abc", "payload": strings.Repeat("x", 100)}, 50)
	var de *stream.DecodeError
	if !errors.As(err, &de) || de.Field != "payload" || !strings.Contains(de.Reason, "over the limit") {
		t.Fatalf("oversize entry with a bad field: %v, want the size error on payload", err)
	}
}

func TestDecodeFields(t *testing.T) {
	t.Parallel()

	// A name given twice: only the last value is decoded and counted
	// toward the size limit (17 bytes: type b, payload 12345).
	for _, c := range []struct {
		fields []string
		size   int
	}{
		{[]string{"type", "a", "payload", "12345", "type", "b"}, 17},
		{[]string{"h.x", "1", "type", "a", "payload", "12345", "h.x", "", "type", "b"}, 20},
	} {
		job, err := stream.DecodeFields(entryID, c.fields, c.size)
		if err != nil || job.Type != "b" || string(job.Payload) != "12345" || (job.Headers != nil && job.Headers["x"] != "") {
			t.Fatalf("DecodeFields(%q, limit %d) = %+v, %v; want type b, payload 12345, header x empty", c.fields, c.size, job, err)
		}
	}
	var de *stream.DecodeError
	_, err := stream.DecodeFields(entryID, []string{"type", "a", "payload", "12345", "type", "b"}, 16)
	if !errors.As(err, &de) || de.Size != 17 {
		t.Fatalf("DecodeFields(17 bytes, limit 16) error %v; want a DecodeError of size 17", err)
	}
	_, err = stream.DecodeFields(entryID, []string{"type", "a", "payload"}, 0)
	if !errors.As(err, &de) || !strings.Contains(de.Reason, "odd number") {
		t.Fatalf("DecodeFields(odd count) error %v; want a DecodeError saying odd number", err)
	}
	for _, f := range [][]string{nil, {}} {
		if _, err := stream.DecodeFields(entryID, f, 0); !errors.As(err, &de) || !strings.Contains(de.Reason, "no fields") {
			t.Fatalf("DecodeFields(%#v) error %v; want no fields", f, err)
		}
	}
	// The field limit counts distinct names, however many times each is
	// given: as when the pairs are a map.
	many := func(distinct, times int) []string {
		f := []string{"type", "t"}
		for range times {
			for i := range distinct {
				f = append(f, "h.n"+strconv.Itoa(i), "v")
			}
		}
		return f
	}
	if job, err := stream.DecodeFields(entryID, many(stream.MaxFields, 3), 0); err != nil || len(job.Headers) != stream.MaxFields {
		t.Fatalf("DecodeFields(%d headers, each given 3 times) = %v; want a job with %d headers", stream.MaxFields, err, stream.MaxFields)
	}
	_, err = stream.DecodeFields(entryID, many(stream.MaxFields+1, 2), 0)
	if !errors.As(err, &de) || de.Fields != stream.MaxFields+1 {
		t.Fatalf("DecodeFields(%d headers, each given twice) error %v; want a DecodeError of %d fields", stream.MaxFields+1, err, stream.MaxFields+1)
	}
	// The fields a replay adds do not count: a job at the limit can be
	// replayed; they stay in Extra.
	replayed := append(many(stream.MaxFields, 1), stream.FieldReplayedFrom, "1-1", stream.FieldReplayCount, "1")
	if job, err := stream.DecodeFields(entryID, replayed, 0); err != nil || job.Extra[stream.FieldReplayCount] != "1" {
		t.Fatalf("DecodeFields(%d headers, replayed) = %v; want a job with replay_count 1 in Extra", stream.MaxFields, err)
	}
	_, err = stream.DecodeFields(entryID, append(replayed, "other", "x"), 0)
	if !errors.As(err, &de) || de.Fields != stream.MaxFields+1 {
		t.Fatalf("DecodeFields(%d headers, replayed, one unknown field) error %v; want a DecodeError of %d fields", stream.MaxFields, err, stream.MaxFields+1)
	}
}
