package keyslot

import "testing"

// The expected slots are those Redis itself reports (CLUSTER KEYSLOT).
func TestOf(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int{
		"":              0,
		"123456789":     12739, // the CRC16 check value 0x31C3
		"foo":           12182,
		"{user1000}.a":  Of("user1000"),
		"foo{}{bar}":    Of("foo{}{bar}"),
		"foo{{bar}}zap": Of("{bar"),
		"{q1}:jobs":     7450,
		"{orders}:dlq":  Of("orders"),
	} {
		if got := Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestTag(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"{orders}:lock:":  "orders",
		"a{b}c{d}":        "b",
		"}{a}":            "a",
		"foo{{bar}}zap":   "{bar",
		"pelican:lock:":   "",
		"a{}{b}":          "",
		"a{b":             "",
		"x}":              "",
		"{}":              "",
		"{shop}:orders:l": "shop",
	} {
		got, ok := Tag(key)
		if got != want || ok != (want != "") {
			t.Errorf("Tag(%q) = %q, %v; want %q, %v", key, got, ok, want, want != "")
		}
	}
}
