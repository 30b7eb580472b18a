package dashboard_test

import (
	"context"
	"github.com/pelicanqueue/pelican/internal/poll"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// The tests run against the real Redis at REDIS_ADDR (redistest.Shared),
// each on streams of its own, with the dashboard mounted under /jobs as a
// host service would.

type bundle struct {
	t      *testing.T
	rdb    *redis.Client
	srv    *httptest.Server
	client *http.Client
	dash   *dashboard.Dashboard
	stream string
	keys   stream.Keys
}

func setup(t *testing.T, cfg dashboard.Config) *bundle {
	t.Helper()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	return setupNamed(t, rdb, name, cfg)
}

func setupNamed(t *testing.T, rdb *redis.Client, name string, cfg dashboard.Config) *bundle {
	t.Helper()
	if cfg.Streams == nil {
		cfg.Streams = []string{name}
	}
	d, err := dashboard.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/jobs/", http.StripPrefix("/jobs", d))
	srv := httptest.NewServer(mux)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	keys, _ := stream.KeysFor(name)
	b := &bundle{t: t, rdb: rdb, srv: srv, client: client, dash: d, stream: name, keys: keys}
	t.Cleanup(func() {
		srv.Close()
		_ = d.Close()
		lease, _ := stream.DerivedKey(keys.Dead, "replay")
		cursor, _ := stream.DerivedKey(keys.Dead, "replay:cursor")
		rdb.Del(context.Background(), name, keys.Dead, keys.Delayed, lease, cursor)
	})
	return b
}

// url returns the dashboard URL of path (which starts with "/").
func (b *bundle) url(path string) string { return b.srv.URL + "/jobs" + path }

// q is the escaped path segment of the bundle's stream.
func (b *bundle) q() string { return url.PathEscape(b.stream) }

func (b *bundle) get(path string) (int, string) {
	b.t.Helper()
	res, err := b.client.Get(b.url(path))
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// csrf returns the CSRF cookie's value, loading a page first if needed.
func (b *bundle) csrf() string {
	b.t.Helper()
	u, _ := url.Parse(b.url("/"))
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == "pelican_csrf" {
			return c.Value
		}
	}
	b.get("/")
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == "pelican_csrf" {
			return c.Value
		}
	}
	b.t.Fatal("no CSRF cookie")
	return ""
}

// post sends a form with the CSRF token and returns the status, body and
// redirect location.
func (b *bundle) post(path string, v url.Values) (int, string, string) {
	b.t.Helper()
	if v == nil {
		v = url.Values{}
	}
	if !v.Has("csrf") {
		v.Set("csrf", b.csrf())
	}
	res, err := b.client.PostForm(b.url(path), v)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body), res.Header.Get("Location")
}

// addDead XADDs a dead letter as consumer/dead.lua writes it and returns
// its ID.
func (b *bundle) addDead(typ, payload, contentType, reason, errText string, extra ...any) string {
	b.t.Helper()
	f := []any{"v", "1", "type", typ, "payload", payload, "job_id", "job-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if contentType != "" {
		f = append(f, "content_type", contentType)
	}
	f = append(f, extra...)
	f = append(f, "dead_reason", reason, "dead_error", errText, "dead_at", strconv.FormatInt(time.Now().UnixMilli(), 10),
		"dead_attempts", "3", "dead_consumer", "c1", "dead_entry_id", "1700000000000-1", "dead_stream", b.stream)
	id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.keys.Dead, Values: f}).Result()
	if err != nil {
		b.t.Fatal(err)
	}
	return id
}

// enqueue adds n jobs of type typ with the Go producer.
func (b *bundle) enqueue(typ string, n int) {
	b.t.Helper()
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.stream})
	for i := range n {
		j, _ := stream.NewJSONJob(typ, map[string]int{"n": i})
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			b.t.Fatal(err)
		}
	}
}

func mustContain(t *testing.T, body string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(body, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}
}

func mustNotContain(t *testing.T, body string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if strings.Contains(body, s) {
			t.Errorf("page holds %q", s)
		}
	}
}

// eventually polls cond until it holds or 10 s pass (widened on a busy
// machine by the caller's own bound).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, poll.True(what, cond))
}
