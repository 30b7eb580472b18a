package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/pelicanqueue/pelican/stream"
)

// shown is a value as a page shows it: text cut at the dashboard's
// MaxValueBytes, and what was cut.
type shown struct {
	Text      string
	Size      int  // bytes of the whole value
	Truncated bool // Text is a prefix
	Binary    bool // Text is a hex dump
}

// cut returns s's first max bytes, ending on a whole UTF-8 character.
func cut(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	i := max
	for i > 0 && i > max-utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i], true
}

// showValue shows raw bytes: as text when they are UTF-8, else as a hex
// dump.
func showValue(b []byte, max int) shown {
	s := shown{Size: len(b)}
	if utf8.Valid(b) {
		s.Text, s.Truncated = cut(string(b), max)
		return s
	}
	s.Binary = true
	n := min(len(b), max/3)
	s.Text = hex.Dump(b[:n])
	s.Truncated = n < len(b)
	return s
}

// decodePayload shows a job's payload decoded to indented JSON whatever
// its content type: JSON as it is, msgpack converted. A payload that does
// not decode is shown raw, and the kind says so.
func decodePayload(p []byte, contentType string, max int) (shown, string) {
	switch contentType {
	case stream.ContentTypeMsgpack:
		var v any
		if err := msgpack.Unmarshal(p, &v); err != nil {
			return showValue(p, max), "msgpack that does not decode: " + err.Error()
		}
		out, err := json.MarshalIndent(jsonable(v), "", "  ")
		if err != nil {
			return showValue(p, max), "msgpack (not convertible to JSON)"
		}
		s := showValue(out, max)
		s.Size = len(p)
		return s, "msgpack, shown as JSON"
	case stream.ContentTypeJSON, "":
		var buf bytes.Buffer
		if err := json.Indent(&buf, p, "", "  "); err != nil {
			return showValue(p, max), "not valid JSON"
		}
		s := showValue(buf.Bytes(), max)
		s.Size = len(p)
		return s, "JSON"
	default:
		return showValue(p, max), "content type " + contentType + ", shown raw"
	}
}

// jsonable converts what msgpack decodes into values encoding/json
// accepts: maps with non-string keys get their keys printed.
func jsonable(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = jsonable(e)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range t {
			t[i] = jsonable(e)
		}
		return t
	default:
		return v
	}
}
