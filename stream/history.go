package stream

import (
	"encoding/json"
	"strings"
)

// The error_history field is a JSON array of strings. Most errors are plain
// printable ASCII, which needs no escaping: those are written and read here
// without encoding/json (a retried job's history is written and read at
// every attempt); anything else goes through encoding/json. Both ways give
// what encoding/json gives (history_test.go compares them).

// encodeHistory returns h as a JSON array of strings, as json.Marshal does.
func encodeHistory(h []string) string {
	n := 2
	for _, s := range h {
		if !plainJSON(s) {
			b, _ := json.Marshal(h)
			return string(b)
		}
		n += len(s) + 3
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('[')
	for i, s := range h {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(s)
		b.WriteByte('"')
	}
	b.WriteByte(']')
	return b.String()
}

// decodeHistory reads v, a JSON array of strings, as json.Unmarshal into a
// []string does; ok is false when v is not one.
func decodeHistory(v string) (h []string, ok bool) {
	if inner, found := strings.CutPrefix(v, `["`); found {
		if inner, found = strings.CutSuffix(inner, `"]`); found {
			h = strings.Split(inner, `","`)
			plain := true
			for _, s := range h {
				if !plainJSON(s) {
					plain = false
					break
				}
			}
			if plain {
				return h, true
			}
		}
	}
	h = nil
	if json.Unmarshal([]byte(v), &h) != nil {
		return nil, false
	}
	return h, true
}

// plainJSON reports whether s is printable ASCII that a JSON string holds
// as it is: no quote, no backslash, and none of the <, > and & that
// json.Marshal escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
