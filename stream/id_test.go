package stream_test

import (
	"slices"
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

func TestSortIDs(t *testing.T) {
	t.Parallel()
	ids := []string{"10-0", "9-10", "x-1", "1-18446744073709551615", "9-9", "2-0", "9-10", "0-0",
		"1-9007199254740993", "1-9007199254740992", "x-1"}
	want := []string{"0-0", "x-1", "x-1", "1-9007199254740992", "1-9007199254740993", "1-18446744073709551615",
		"2-0", "9-9", "9-10", "9-10", "10-0"}
	stream.SortIDs(ids)
	if !slices.Equal(ids, want) {
		t.Errorf("SortIDs = %q, want %q", ids, want)
	}
	for i := 1; i < len(ids); i++ {
		if stream.CompareIDs(ids[i-1], ids[i]) > 0 {
			t.Errorf("SortIDs put %q before %q", ids[i-1], ids[i])
		}
	}
	stream.SortIDs(nil) // no panic
}
