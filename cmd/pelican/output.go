package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"
)

// printJSON writes v to a.out as indented JSON followed by a newline.
func printJSON(a *app, v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// table writes aligned columns to a.out; Flush writes them.
type table struct {
	w *tabwriter.Writer
}

// newTable returns a table writing to a.out with the given header row.
func newTable(a *app, headers ...string) *table {
	t := &table{w: tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)}
	if len(headers) > 0 {
		cells := make([]any, len(headers))
		for i, h := range headers {
			cells[i] = h
		}
		t.Row(cells...)
	}
	return t
}

// Row adds one row; each cell is formatted with fmt (durations rounded,
// nil as "-").
func (t *table) Row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(t.w, "\t")
		}
		fmt.Fprint(t.w, cell(c))
	}
	fmt.Fprint(t.w, "\n")
}

// Flush writes the buffered rows.
func (t *table) Flush() error {
	return t.w.Flush()
}

func cell(c any) string {
	switch v := c.(type) {
	case nil:
		return "-"
	case time.Duration:
		return fmtDuration(v)
	case *int64:
		if v == nil {
			return "-"
		}
		return fmt.Sprint(*v)
	case string:
		if v == "" {
			return "-"
		}
		return v
	default:
		return fmt.Sprint(v)
	}
}

// fmtDuration rounds d for humans: ms below 1s, s below 1m, else s precision.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
