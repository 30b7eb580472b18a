package stream_test

import (
	"testing"

	"github.com/pelicanqueue/pelican/stream"
)

func TestCompareIDs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"9-0", "10-0", -1},
		{"10-0", "9-0", 1},
		{"1-9", "1-10", -1},
		{"1-18446744073709551615", "2-0", -1},
		{"1-9007199254740993", "1-9007199254740992", 1}, // past float precision
		{"5-5", "5-5", 0},
		{"x-1", "0-0", 0}, // malformed reads as 0-0
	} {
		if got := stream.CompareIDs(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareIDs(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if pa, err := stream.ParseID(tc.a); err == nil {
			if pb, err := stream.ParseID(tc.b); err == nil && pa.Compare(pb) != tc.want {
				t.Errorf("ParseID(%q).Compare(%q) = %d, want %d", tc.a, tc.b, pa.Compare(pb), tc.want)
			}
		}
	}
	for _, bad := range []string{"", "1", "1-", "-1", "a-1", "1-1-1", "18446744073709551616-0"} {
		if _, err := stream.ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) succeeded", bad)
		}
	}
	if id, _ := stream.ParseID("17-42"); id.String() != "17-42" {
		t.Errorf("String() = %q", id.String())
	}
}
