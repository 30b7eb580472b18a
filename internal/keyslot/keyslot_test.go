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
