package stream

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ID is a parsed stream entry ID, "<ms>-<seq>". IDs are compared as pairs of
// 64-bit integers: never as strings (which would put "10-0" before "9-0") or
// floating-point numbers (which cannot hold every 64-bit sequence number a
// producer may choose).
type ID struct {
	Ms, Seq uint64
}

// ParseID parses an entry ID "<ms>-<seq>" with both parts decimal.
func ParseID(s string) (ID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return ID{}, fmt.Errorf("invalid stream entry ID %q (want <ms>-<seq>)", s)
	}
	return ID{a, b}, nil
}

// Compare returns -1, 0 or +1 as a is before, equal to or after b.
func (a ID) Compare(b ID) int {
	if c := cmp.Compare(a.Ms, b.Ms); c != 0 {
		return c
	}
	return cmp.Compare(a.Seq, b.Seq)
}

// String returns "<ms>-<seq>".
func (a ID) String() string {
	return strconv.FormatUint(a.Ms, 10) + "-" + strconv.FormatUint(a.Seq, 10)
}

// CompareIDs orders two entry IDs as [ID.Compare] does; a part that does not
// parse reads as 0. It does not allocate.
func CompareIDs(a, b string) int {
	am, as := splitID(a)
	bm, bs := splitID(b)
	return ID{am, as}.Compare(ID{bm, bs})
}

// SortIDs sorts entry IDs in place in the order of [CompareIDs], equal IDs
// (malformed ones, which read as 0-0) by their text, so that copies of an ID
// end up next to each other. It parses each ID once, not at each comparison.
func SortIDs(ids []string) {
	if len(ids) < 2 {
		return
	}
	type key struct {
		id ID
		s  string
	}
	keys := make([]key, len(ids))
	for i, s := range ids {
		ms, seq := splitID(s)
		keys[i] = key{ID{ms, seq}, s}
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := a.id.Compare(b.id); c != 0 {
			return c
		}
		return strings.Compare(a.s, b.s)
	})
	for i, k := range keys {
		ids[i] = k.s
	}
}

// splitID parses "<ms>-<seq>"; malformed parts read as 0.
func splitID(id string) (ms, seq uint64) {
	cur := &ms
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c == '-' {
			cur = &seq
			continue
		}
		if c < '0' || c > '9' {
			return 0, 0
		}
		*cur = *cur*10 + uint64(c-'0')
	}
	return ms, seq
}
