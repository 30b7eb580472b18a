package stream

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MaxFields is the most fields (name/value pairs) an entry may have besides
// the wire format's own (v, type, payload, job_id, ... first_failed_at) and
// those a replay adds ([FieldReplayedFrom], [FieldReplayCount]): headers and
// unknown fields together. [DecodeLimit] rejects an entry with more. It bounds what a settlement script copies (Lua cannot pass an
// unbounded list of values to one command), and since the wire format's
// own fields do not count, a job at the limit can still be retried.
const MaxFields = 1000

// ownFields is the number of the wire format's own fields.
const ownFields = 17

// DefaultMaxEntryBytes is the largest entry, counting the bytes of all field
// names and values, that [Decode] accepts.
const DefaultMaxEntryBytes = 16 << 20

// DecodeError reports a stream entry that is not a valid job. The consumer
// dead-letters such an entry with reason "malformed" and this error's text.
type DecodeError struct {
	// EntryID is the ID of the entry.
	EntryID string
	// Field names the offending field; empty when the entry as a whole is
	// wrong (no fields at all).
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Size is the entry's size in bytes (field names and values) when it is
	// over the size limit, and 0 otherwise.
	Size int
	// Fields is nonzero when the entry has more than [MaxFields] fields
	// besides the wire format's own: the number of fields counted.
	Fields int
}

// CutBytes is how much of each field name and value is kept of an entry
// over the size limit: in its dead letter, and of the field name its
// [DecodeError] reports (an entry whose bulk is one name must not come back
// whole in its error).
const CutBytes = 1024

// OversizeError returns the error of entry id, size bytes (field names and
// values, each name once with its last value) over the limit of maxBytes,
// reported for field, the name of its longest value, cut to [CutBytes]:
// what [DecodeLimit] returns for such an entry, for a reader that learnt
// its size and field without reading it whole.
func OversizeError(id, field string, size, maxBytes int) *DecodeError {
	field = field[:min(len(field), CutBytes)]
	return &DecodeError{EntryID: id, Field: field, Reason: fmt.Sprintf("entry is %d bytes, over the limit of %d", size, maxBytes), Size: size}
}

// Error implements error.
func (e *DecodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("stream: entry %s: %s", e.EntryID, e.Reason)
	}
	return fmt.Sprintf("stream: entry %s: field %q: %s", e.EntryID, e.Field, e.Reason)
}

// Encode returns the job's fields in wire format v1, as alternating names and
// values ready for XADD. It writes only fields that differ from their
// defaults (content_type is left out for [ContentTypeJSON], which is what
// Decode reads when it is absent), and Headers and Extra in name order.
// Delivery fields (EntryID, Stream, Group, Deliveries, AttemptLimit) are not
// written, nor is an Extra entry whose name is a v1 field or a header field.
func Encode(j *Job) []any {
	return AppendEncode(nil, j)
}

// AppendEncode appends the job's fields, as [Encode] returns them, to dst
// and returns the extended slice: a caller that sends other values before
// the fields (a script's arguments) builds them in one slice.
func AppendEncode(dst []any, j *Job) []any {
	// Room for every field at once: growing the slice would copy it, and a
	// closure appending to it would move it to the heap.
	f := slices.Grow(dst, encodedCap(j))
	f = append(f, FieldVersion, "1", FieldType, j.Type, FieldPayload, j.Payload)
	if j.ID != "" {
		f = append(f, FieldJobID, j.ID)
	}
	if j.ContentType != "" && j.ContentType != ContentTypeJSON {
		f = append(f, FieldContentType, j.ContentType)
	}
	if j.IdempotencyKey != "" {
		f = append(f, FieldIdempotencyKey, j.IdempotencyKey)
	}
	if j.Attempt > 0 {
		f = append(f, FieldAttempt, strconv.Itoa(j.Attempt))
	}
	if j.MaxAttempts > 0 {
		f = append(f, FieldMaxAttempts, strconv.Itoa(j.MaxAttempts))
	}
	if !j.CreatedAt.IsZero() {
		f = append(f, FieldCreatedAt, strconv.FormatInt(j.CreatedAt.UnixMilli(), 10))
	}
	if j.LockKey != "" {
		f = append(f, FieldLockKey, j.LockKey)
	}
	if j.TraceParent != "" {
		f = append(f, FieldTraceParent, j.TraceParent)
	}
	if j.TraceState != "" {
		f = append(f, FieldTraceState, j.TraceState)
	}
	if j.LastError != "" {
		f = append(f, FieldLastError, j.LastError)
	}
	if len(j.ErrorHistory) > 0 {
		f = append(f, FieldErrorHistory, encodeHistory(j.ErrorHistory))
	}
	if !j.FirstFailedAt.IsZero() {
		f = append(f, FieldFirstFailedAt, strconv.FormatInt(j.FirstFailedAt.UnixMilli(), 10))
	}
	if j.Suspect {
		f = append(f, FieldSuspect, "1")
	}
	if j.Track {
		f = append(f, FieldTrack, "1")
	}
	for _, k := range sortedKeys(j.Headers) {
		f = append(f, HeaderPrefix+k, j.Headers[k])
	}
	for _, k := range sortedKeys(j.Extra) {
		if isFormatField(k) {
			// Decode never puts such a name in Extra; writing it would
			// shadow the real field (Extra["type"] would reroute the job).
			continue
		}
		f = append(f, k, j.Extra[k])
	}
	return f
}

// encodedCap is the most values AppendEncode appends for j.
func encodedCap(j *Job) int { return 2 * (ownFields + len(j.Headers) + len(j.Extra)) }

// isFormatField reports whether name is a field of wire format v1, a header
// field (h.<name>) included.
func isFormatField(name string) bool {
	if ownBit(name) != 0 {
		return true
	}
	h, ok := strings.CutPrefix(name, HeaderPrefix)
	return ok && h != ""
}

func sortedKeys(m map[string]string) []string {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Decode turns the fields of stream entry id, as go-redis returns them in
// redis.XMessage.Values, into a Job. It rejects entries larger than
// [DefaultMaxEntryBytes]; see [DecodeLimit].
func Decode(id string, fields map[string]any) (*Job, error) {
	return DecodeLimit(id, fields, DefaultMaxEntryBytes)
}

// DecodeLimit is [Decode] with a size limit: an entry whose field names and
// values add up to more than maxBytes is rejected. maxBytes <= 0 means no
// limit. The returned error is always a *DecodeError; the function never
// panics, whatever the entry holds.
func DecodeLimit(id string, fields map[string]any, maxBytes int) (*Job, error) {
	pairs := make([]string, 0, 2*len(fields))
	var bad *DecodeError // a value that is not a string: the smallest name's
	for name, raw := range fields {
		if v, ok := raw.(string); ok {
			pairs = append(pairs, name, v)
		} else if bad == nil || name < bad.Field {
			bad = &DecodeError{EntryID: id, Field: name, Reason: fmt.Sprintf("value is a %T, not a string", raw)}
		}
	}
	return decode(id, pairs, len(fields), maxBytes, bad)
}

// Field returns the value of name among an entry's fields as Redis sends
// them (name, value, name, value ...): of a name given twice the last
// value, the one [DecodeFields] decodes; "" when the name is not there.
func Field(fields []string, name string) string {
	for i := len(fields)&^1 - 2; i >= 0; i -= 2 {
		if fields[i] == name {
			return fields[i+1]
		}
	}
	return ""
}

// DecodeFields is [DecodeLimit] for an entry's fields as Redis sends them:
// names and values in order (name, value, name, value ...), with no map to
// build. Of a name given twice only the last value counts: it is the one
// decoded, checked and counted toward the size and field limits, as in a
// map built from the pairs (go-redis's typed reads build one), so that an
// entry decodes the same however it was read. An odd count is rejected.
func DecodeFields(id string, fields []string, maxBytes int) (*Job, error) {
	if len(fields)%2 != 0 {
		return nil, &DecodeError{EntryID: id, Reason: fmt.Sprintf("entry has an odd number of field names and values (%d)", len(fields))}
	}
	return decode(id, fields, len(fields)/2, maxBytes, nil)
}

// counted returns the fields of j that count toward MaxFields: its headers
// and unknown fields, but those a replay adds.
func (j *Job) counted() int {
	n := len(j.Headers) + len(j.Extra)
	for _, name := range [...]string{FieldReplayedFrom, FieldReplayCount} {
		if _, ok := j.Extra[name]; ok {
			n--
		}
	}
	return n
}

// has reports whether j holds name (not a field of the format's own) as a
// header or an unknown field.
func (j *Job) has(name string) bool {
	if h, ok := strings.CutPrefix(name, HeaderPrefix); ok && h != "" {
		_, ok := j.Headers[h]
		return ok
	}
	_, ok := j.Extra[name]
	return ok
}

// ownBit returns a bit of its own for each of the format's fields, 0 for
// another name.
func ownBit(name string) uint32 {
	switch name {
	case FieldVersion:
		return 1 << 0
	case FieldType:
		return 1 << 1
	case FieldPayload:
		return 1 << 2
	case FieldJobID:
		return 1 << 3
	case FieldIdempotencyKey:
		return 1 << 4
	case FieldAttempt:
		return 1 << 5
	case FieldMaxAttempts:
		return 1 << 6
	case FieldCreatedAt:
		return 1 << 7
	case FieldLockKey:
		return 1 << 8
	case FieldContentType:
		return 1 << 9
	case FieldTraceParent:
		return 1 << 10
	case FieldTraceState:
		return 1 << 11
	case FieldLastError:
		return 1 << 12
	case FieldErrorHistory:
		return 1 << 13
	case FieldFirstFailedAt:
		return 1 << 14
	case FieldSuspect:
		return 1 << 15
	case FieldTrack:
		return 1 << 16
	}
	return 0
}

// decode decodes the n fields of entry id: pairs (name, value ...) and, in
// bad, the error of one that is not a string (nil if none).
func decode(id string, pairs []string, n int, maxBytes int, bad *DecodeError) (*Job, error) {
	fail := func(field, format string, args ...any) (*Job, error) {
		return nil, &DecodeError{EntryID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if n == 0 {
		return fail("", "entry has no fields (an empty or trimmed entry)")
	}
	j := &Job{EntryID: id}
	// Every field is looked at before an error is returned, so that the
	// error does not depend on the fields' order: the size limit first, then
	// the wrong field with the smallest name.
	reject := func(field, format string, args ...any) {
		if bad == nil || field < bad.Field {
			bad = &DecodeError{EntryID: id, Field: field, Reason: fmt.Sprintf(format, args...)}
		}
	}
	// Backwards, so that the last value of a name given twice is the one
	// decoded, checked and counted toward the size (seen: the format's
	// fields met so far), as when the pairs are a map.
	size, biggest, biggestLen, typed := 0, "", -1, false
	var seen uint32
	for i := len(pairs) - 2; i >= 0; i -= 2 {
		name, v := pairs[i], pairs[i+1]
		if bit := ownBit(name); bit != 0 {
			if seen&bit != 0 {
				continue
			}
			seen |= bit
		} else if j.has(name) {
			continue
		}
		size += len(name) + len(v)
		if len(v) > biggestLen || (len(v) == biggestLen && name < biggest) {
			biggest, biggestLen = name, len(v)
		}
		var err error
		switch name {
		case FieldVersion:
			if v != "1" {
				reject(name, "unsupported format version %s (this consumer reads version 1)", quote(v))
			}
		case FieldType:
			j.Type, typed = v, true
		case FieldPayload:
			if maxBytes <= 0 || len(v) <= maxBytes {
				j.Payload = []byte(v)
			}
		case FieldJobID:
			j.ID = v
		case FieldIdempotencyKey:
			j.IdempotencyKey = v
		case FieldAttempt:
			j.Attempt, err = nonNegative(v)
		case FieldMaxAttempts:
			j.MaxAttempts, err = nonNegative(v)
		case FieldCreatedAt:
			var ms int
			if ms, err = nonNegative(v); err == nil && ms > 0 {
				j.CreatedAt = time.UnixMilli(int64(ms))
			}
		case FieldLockKey:
			j.LockKey = v
		case FieldContentType:
			j.ContentType = v
		case FieldTraceParent:
			j.TraceParent = v
		case FieldTraceState:
			j.TraceState = v
		case FieldLastError:
			j.LastError = v
		case FieldErrorHistory:
			var ok bool
			if j.ErrorHistory, ok = decodeHistory(v); !ok {
				reject(name, "not a JSON array of strings (got %s)", quote(v))
			}
		case FieldFirstFailedAt:
			var ms int
			if ms, err = nonNegative(v); err == nil && ms > 0 {
				j.FirstFailedAt = time.UnixMilli(int64(ms))
			}
		case FieldSuspect:
			j.Suspect = v == "1"
		case FieldTrack:
			j.Track = v == "1"
		default:
			if h, ok := strings.CutPrefix(name, HeaderPrefix); ok && h != "" {
				if j.Headers == nil {
					j.Headers = make(map[string]string)
				}
				j.Headers[h] = v
			} else {
				if j.Extra == nil {
					j.Extra = make(map[string]string)
				}
				j.Extra[name] = v
			}
		}
		if err != nil {
			reject(name, "%v (got %s)", err, quote(v))
		}
	}
	if maxBytes > 0 && size > maxBytes {
		return nil, OversizeError(id, biggest, size, maxBytes)
	}
	if n := j.counted(); n > MaxFields {
		return nil, &DecodeError{EntryID: id, Reason: fmt.Sprintf("entry has %d fields, over the limit of %d besides the format's own", n, MaxFields), Fields: n}
	}
	if bad != nil {
		return nil, bad
	}
	if j.Type == "" {
		if typed {
			return fail(FieldType, "is empty")
		}
		return fail(FieldType, "is missing")
	}
	if j.ID == "" {
		j.ID = id
	}
	if j.CreatedAt.IsZero() {
		j.CreatedAt, _ = EntryTime(id)
	}
	if j.ContentType == "" {
		j.ContentType = ContentTypeJSON
	}
	return j, nil
}

// nonNegative parses a decimal integer that fits an int64, nothing else: no
// sign, no spaces, no exponent.
func nonNegative(v string) (int, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, errors.New("not a non-negative decimal integer")
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errors.New("not a non-negative decimal integer")
	}
	return int(n), nil
}

// quote renders a foreign value for an error message: quoted, and cut short.
func quote(v string) string {
	const max = 64
	if len(v) > max {
		return strconv.Quote(v[:max]) + "..."
	}
	return strconv.Quote(v)
}
