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

// The table-driven CRC16 gives the bit-by-bit one's value for every byte
// and for longer keys.
func TestCRC16_matchesBitwise(t *testing.T) {
	t.Parallel()
	bitwise := func(s string) uint16 {
		var crc uint16
		for i := 0; i < len(s); i++ {
			crc ^= uint16(s[i]) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ 0x1021
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	keys := []string{"", "{orders}:lock:customer-42", "\xff\x00\x80 pelican"}
	for b := range 256 {
		keys = append(keys, string([]byte{byte(b)}), "k"+string([]byte{byte(b), byte(255 - b)}))
	}
	for _, k := range keys {
		if got, want := crc16(k), bitwise(k); got != want {
			t.Fatalf("crc16(%q) = %#04x, want %#04x", k, got, want)
		}
	}
}

// Same agrees with Of.
func TestSame(t *testing.T) {
	t.Parallel()
	keys := []string{"", "foo", "{orders}:lock:{a}", "{orders}:idem:{b}", "orders", "{shop}:x",
		"{user1000}.a", "user1000", "a{}{b}", "{b}x", "foo{{bar}}zap", "{bar", "123456789", "{123456789}"}
	for _, a := range keys {
		for _, b := range keys {
			if got, want := Same(a, b), Of(a) == Of(b); got != want {
				t.Errorf("Same(%q, %q) = %v, want %v", a, b, got, want)
			}
		}
	}
}
