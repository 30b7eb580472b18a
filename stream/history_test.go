package stream

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHistory_matchesEncodingJSON checks encodeHistory and decodeHistory
// against encoding/json, on chosen values and on random ones drawn from
// the characters the fast path must tell apart.
func TestHistory_matchesEncodingJSON(t *testing.T) {
	t.Parallel()

	histories := [][]string{
		{}, {""}, {"", ""}, {"a"}, {"smtp: 451 try later", "dial tcp: i/o timeout"},
		{`say "hi"`}, {`back\slash`}, {"<b>&</b>"}, {"tab\there"}, {"é"}, {"\xff"}, {`","`}, {`"]`},
	}
	alphabet := []byte(`ab ,[]"\<>&` + "\x00\x1f\x7f\xc3\xa9")
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		h := make([]string, r.IntN(4))
		for i := range h {
			b := make([]byte, r.IntN(6))
			for k := range b {
				b[k] = alphabet[r.IntN(len(alphabet))]
			}
			h[i] = string(b)
		}
		histories = append(histories, h)
	}
	for _, h := range histories {
		want, _ := json.Marshal(h)
		if got := encodeHistory(h); got != string(want) {
			t.Errorf("encodeHistory(%q) = %s, want %s", h, got, want)
		}
	}

	values := []string{`[]`, `[""]`, `["a"]`, `["a","b"]`, `[ "a" ]`, `["a" ,"b"]`, `null`, `["a"`, `"a"]`,
		`["a"]x`, `["a\"b"]`, `["\u003c"]`, `[1]`, `["a",]`, `["a""b"]`, `["` + "\x01" + `"]`, `["é"]`, ``}
	alphabet = []byte(`a ,[]"\u0` + "\x01\xc3\xa9")
	for range 5000 {
		b := make([]byte, r.IntN(10))
		for k := range b {
			b[k] = alphabet[r.IntN(len(alphabet))]
		}
		values = append(values, `["`+string(b)+`"]`, string(b))
	}
	for _, v := range values {
		var want []string
		wantOK := json.Unmarshal([]byte(v), &want) == nil
		got, ok := decodeHistory(v)
		if ok != wantOK || (ok && (!slices.Equal(got, want) || (got == nil) != (want == nil))) {
			t.Errorf("decodeHistory(%q) = %q, %v; encoding/json: %q, %v", v, got, ok, want, wantOK)
		}
	}
}
