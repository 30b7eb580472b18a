package dlq

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// Filter selects dead-letter entries. An entry matches when it passes every
// criterion that is set; a criterion with several values (Types, Reasons,
// IDs) passes when any value matches. The zero Filter matches every entry.
type Filter struct {
	// Types keeps entries whose job type (the type field) is one of these.
	Types []string
	// Reasons keeps entries whose dead_reason is one of these.
	Reasons []string
	// Since keeps entries dead-lettered at or after this time (dead_at).
	Since time.Time
	// Until keeps entries dead-lettered before this time (dead_at).
	Until time.Time
	// ErrorContains keeps entries whose dead_error contains this text
	// (case-sensitive).
	ErrorContains string
	// IDs keeps only the dead-letter entries with these IDs; only these are
	// read.
	IDs []string
}

func (f Filter) isZero() bool {
	return len(f.Types) == 0 && len(f.Reasons) == 0 && f.Since.IsZero() && f.Until.IsZero() &&
		f.ErrorContains == "" && len(f.IDs) == 0
}

// fingerprint identifies the filter in a replay cursor: a replay resumes
// only a cursor written with the same filter.
func (f Filter) fingerprint() string {
	m, _ := f.compile()
	var b strings.Builder
	list := func(name string, v []string) {
		s := slices.Clone(v)
		slices.Sort(s)
		s = slices.Compact(s)
		fmt.Fprintf(&b, "%s=%q;", name, s)
	}
	list("types", f.Types)
	list("reasons", f.Reasons)
	ms := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return strconv.FormatInt(t.UnixMilli(), 10)
	}
	fmt.Fprintf(&b, "since=%s;until=%s;error=%q;", ms(f.Since), ms(f.Until), f.ErrorContains)
	if m != nil {
		list("ids", m.ids)
	}
	return b.String()
}

// matcher is a validated Filter.
type matcher struct {
	f   Filter
	ids []string // sorted, unique, by entry ID order; nil when f.IDs is empty
}

func (f Filter) compile() (*matcher, error) {
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return nil, fmt.Errorf("dlq: Filter.Since (%v) must be before Filter.Until (%v)", f.Since, f.Until)
	}
	m := &matcher{f: f}
	if len(f.IDs) > 0 {
		parsed := make(map[string]stream.ID, len(f.IDs))
		for _, id := range f.IDs {
			p, err := stream.ParseID(id)
			if err != nil {
				return nil, fmt.Errorf("dlq: Filter.IDs: %w", err)
			}
			parsed[id] = p
		}
		m.ids = make([]string, 0, len(parsed))
		for id := range parsed {
			m.ids = append(m.ids, id)
		}
		slices.SortFunc(m.ids, func(a, b string) int {
			pa, pb := parsed[a], parsed[b]
			switch {
			case pa.Compare(pb) < 0:
				return -1
			case pb.Compare(pa) < 0:
				return 1
			}
			return 0
		})
		// "1-1" and "01-1" name the same entry: keep one.
		m.ids = slices.CompactFunc(m.ids, func(a, b string) bool { return parsed[a] == parsed[b] })
	}
	return m, nil
}

func (m *matcher) match(e *Entry) bool {
	f := &m.f
	if len(f.Types) > 0 && !slices.Contains(f.Types, e.Type()) {
		return false
	}
	if len(f.Reasons) > 0 && !slices.Contains(f.Reasons, e.Reason) {
		return false
	}
	if !f.Since.IsZero() && e.DeadAt.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && !e.DeadAt.Before(f.Until) {
		return false
	}
	if f.ErrorContains != "" && !strings.Contains(e.Error, f.ErrorContains) {
		return false
	}
	return true
}
