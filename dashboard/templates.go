package dashboard

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// pageNames are the templates/<name>.html files, each rendered inside
// templates/layout.html.
var pageNames = []string{"overview", "queue", "dead", "entry", "confirm", "error"}

func parseTemplates() (map[string]*template.Template, error) {
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: templates: %w", err)
	}
	out := make(map[string]*template.Template, len(pageNames))
	for _, n := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

var funcs = template.FuncMap{
	"link":     link,
	"dur":      fmtDuration,
	"num":      fmtInt,
	"time":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
	"query":    func(v url.Values) string { return v.Encode() },
	"bytes":    fmtBytes,
	"add":      func(a, b int) int { return a + b },
	"lagText":  func(n int64) string { return map[bool]string{true: "?", false: fmtInt(n)}[n < 0] },
	"truncMid": truncMid,
	"rate":     fmtRate,
	"int64":    func(i int) int64 { return int64(i) },
}

// fmtDuration writes d rounded for reading: 850ms, 12s, 4m10s, 3h20m, 2d4h.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDuration(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return strings.TrimSuffix(d.Round(time.Second).String(), "0s")
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		days := int64(d / (24 * time.Hour))
		return fmt.Sprintf("%dd%dh", days, int64(d%(24*time.Hour)/time.Hour))
	}
}

// fmtInt writes n with thousands separators.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtBytes(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// truncMid shortens s to about n characters, keeping both ends.
func truncMid(n int, s string) string {
	r := []rune(s)
	if len(r) <= n || n < 5 {
		return s
	}
	h := (n - 1) / 2
	return string(r[:h]) + "…" + string(r[len(r)-h:])
}

func trimFloat(f float64, prec int) string {
	s := strconv.FormatFloat(f, 'f', prec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
