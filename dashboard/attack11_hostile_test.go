package dashboard_test

import (
	"context"
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var (
	a11Tag     = regexp.MustCompile(`(?i)<\s*(script|img|svg|iframe|object|embed|a|form|input|base|meta|link|style)\b[^>]*>`)
	a11OnAttr  = regexp.MustCompile(`(?i)<[^>]*\son[a-z]+\s*=`)
	a11Href    = regexp.MustCompile(`(?i)(href|src|action)="([^"]*)"`)
	a11Markers = []string{"a11xss"} // every hostile value carries this word
)

// a11CheckPage fails when the page holds markup a hostile value could have
// injected: a tag or an event attribute carrying the marker, an inline script,
// or a link that is not to the dashboard itself or the configured trace URL.
func a11CheckPage(t *testing.T, where, page string) {
	t.Helper()
	quoted := regexp.MustCompile(`"[^"]*"`)
	for _, m := range a11Tag.FindAllString(page, -1) {
		low := strings.ToLower(quoted.ReplaceAllString(m, `""`)) // markup outside attribute values
		if strings.Contains(low, "a11xss") || strings.HasPrefix(low, "<script") && m != `<script src="/assets/app.js" defer>` {
			t.Errorf("%s: injected tag %q", where, m)
		}
	}
	for _, m := range a11OnAttr.FindAllString(quoted.ReplaceAllString(page, `""`), -1) {
		t.Errorf("%s: event handler attribute in %q", where, m)
	}
	for _, m := range a11Href.FindAllStringSubmatch(page, -1) {
		u := html.UnescapeString(m[2])
		if strings.HasPrefix(u, "/") && !strings.HasPrefix(u, "//") || strings.HasPrefix(u, "?") || u == "" ||
			strings.HasPrefix(u, "http://jaeger.test/trace/") {
			continue
		}
		t.Errorf("%s: %s points outside the dashboard: %q", where, m[1], u)
	}
}

// Promises (doc.go, SECURITY.md): "Every field a producer chose (type, payload,
// errors, IDs) is rendered by html/template with contextual escaping"; stream
// names are listed from SCAN and linked as /queues/{stream}.
func TestAttack11_HostileStreamNamesAndFields(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb := srv.Client(t)
	ctx := context.Background()
	names := []string{
		`<script>alert("a11xss")</script>`,
		`"><img src=x onerror=alert(1) a11xss>`,
		`a11xss/../../dead`,
		`a11xss?x=1#frag`,
		`a11xss%2F%3Cb%3E`,
		`javascript:alert('a11xss')`,
		"a11xss\nline\ttab",
		`a11xss' onmouseover='alert(1)`,
		`//evil.example/a11xss`,
		`a11xss space and ünïcödé`,
	}
	hostile := `</pre></td><script>alert('a11xss')</script><img src=x onerror=alert(1) a11xss>`
	for _, n := range names {
		if _, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: n, Values: []any{"type", hostile, "payload", `{"x":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`,
			"job_id", hostile, hostile, hostile, "h." + hostile, hostile}}).Result(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "{" + n + "}:dlq", Values: []any{
			"type", hostile, "payload", `{"x":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`, "job_id", hostile,
			"traceparent", `00-"><script>a11xss</script>-00f067aa0ba902b7-01`, "last_error", hostile,
			"error_history", `["` + strings.ReplaceAll(hostile, `"`, `\"`) + `"]`, hostile, hostile,
			"dead_reason", hostile, "dead_error", hostile, "dead_at", fmt.Sprint(time.Now().UnixMilli()),
			"dead_attempts", hostile, "dead_consumer", hostile, "dead_entry_id", hostile, "dead_stream", n,
		}}).Err(); err != nil {
			t.Fatal(err)
		}
		// A traced dead letter with a well-formed but attacker-chosen trace ID.
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "{" + n + "}:dlq", Values: []any{"type", "ok", "payload", "\x93\xa6a11xss\xc0\xff",
			"content_type", "application/msgpack", "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"dead_reason", "permanent", "dead_error", hostile, "dead_at", fmt.Sprint(time.Now().UnixMilli()), "dead_stream", n}})
		rdb.ZAdd(ctx, "{"+n+"}:delayed", redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: hostile})
		rdb.XGroupCreate(ctx, n, hostile, "0")
		rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: hostile, Consumer: hostile, Streams: []string{n, ">"}, Count: 1, Block: -1})
	}
	b := newA11(t, rdb, dashboard.Config{TraceURL: "http://jaeger.test/trace/{trace_id}", StuckAfter: time.Millisecond})
	code, page := b.get("/")
	if code != 200 {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	a11CheckPage(t, "overview", page)
	links := map[string]bool{}
	for _, m := range a11Href.FindAllStringSubmatch(page, -1) {
		if strings.HasPrefix(m[2], "/queues/") {
			links[html.UnescapeString(m[2])] = true
		}
	}
	for _, n := range names {
		// The queue's page must be reachable through the overview's link, and be that queue's.
		var link string
		for l := range links {
			u, err := url.Parse(l)
			if err != nil {
				continue
			}
			if u.Path == "/queues/"+n || strings.TrimPrefix(u.EscapedPath(), "/queues/") == url.PathEscape(n) {
				link = l
			}
		}
		if link == "" {
			t.Errorf("overview has no link to queue %q (links: %v)", n, links)
			continue
		}
		code, qp := b.get(link)
		if code != 200 || !strings.Contains(qp, "<h1>"+html.EscapeString(n)) {
			t.Errorf("queue %q via %q: status %d, not its page:\n%.600s", n, link, code, qp)
			continue
		}
		a11CheckPage(t, "queue "+n, qp)
		if !strings.Contains(qp, "&lt;/pre&gt;&lt;/td&gt;") {
			t.Errorf("queue page of %q shows no hostile value", n)
		}
		code, dp := b.get(link + "/dead")
		if code != 200 {
			t.Errorf("dead letters of %q: %d", n, code)
			continue
		}
		a11CheckPage(t, "dead "+n, dp)
		for _, m := range regexp.MustCompile(`href="(/queues/[^"]+/dead/[0-9]+-[0-9]+)"`).FindAllStringSubmatch(dp, -1) {
			code, jp := b.get(html.UnescapeString(m[1]))
			if code != 200 {
				t.Errorf("job view %s: %d", m[1], code)
				continue
			}
			a11CheckPage(t, "job "+m[1], jp)
			if !strings.Contains(jp, "&lt;script&gt;alert(") {
				t.Errorf("job view %s does not show the hostile value at all (so the check proves nothing)", m[1])
			}
		}
	}
}
