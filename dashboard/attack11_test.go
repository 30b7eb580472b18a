package dashboard_test

// Outside attacks on the dashboard's documented promises (attack3): written from
// README.md, SECURITY.md and the godoc only.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/redis/go-redis/v9"
)

func a11Client(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Skipf("no Redis at 127.0.0.1:6379: %v", err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// a11Stream returns a fresh stream name of this test and deletes its keys at the end.
func a11Stream(t *testing.T, rdb *redis.Client, base string) string {
	t.Helper()
	s := fmt.Sprintf("a11-%s-%d", base, time.Now().UnixNano())
	del := func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, "{"+s+"}:*").Result()
		rdb.Del(ctx, append(keys, s)...)
	}
	del()
	t.Cleanup(del)
	return s
}

func a11Dead(t *testing.T, rdb *redis.Client, s string, n int, reason string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "{" + s + "}:dlq", Values: []any{
			"type", "a11.job", "payload", fmt.Sprintf(`{"i":%d}`, i), "job_id", fmt.Sprintf("j-%s-%d", reason, i),
			"dead_reason", reason, "dead_error", "boom", "dead_at", fmt.Sprint(time.Now().UnixMilli()),
			"dead_attempts", "1", "dead_stream", s,
		}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

type a11Browser struct {
	t    *testing.T
	base string
	tok  string
}

func (b *a11Browser) get(path string) (int, string) {
	b.t.Helper()
	res, err := http.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, c := range res.Cookies() {
		if c.Name == "pelican_csrf" && b.tok == "" {
			b.tok = c.Value
		}
	}
	return res.StatusCode, string(body)
}

func (b *a11Browser) post(path string, form url.Values, hdr map[string]string) (int, string) {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if b.tok != "" {
		req.AddCookie(&http.Cookie{Name: "pelican_csrf", Value: b.tok})
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// confirmForm returns the hidden fields of the confirmation form on a page.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	i := strings.Index(page, `class="confirm"`)
	if i < 0 {
		t.Fatalf("no confirmation form in:\n%s", page)
	}
	rest := page[i:]
	rest = rest[:strings.Index(rest, "</form>")]
	v := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(rest, -1) {
		v.Set(m[1], strings.ReplaceAll(m[2], "&#34;", `"`))
	}
	return v
}

func newA11(t *testing.T, rdb *redis.Client, cfg dashboard.Config) *a11Browser {
	t.Helper()
	d, err := dashboard.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() { srv.Close(); d.Close() })
	return &a11Browser{t: t, base: srv.URL}
}

// Promise: "each asks first on a confirmation page that states how many jobs it
// touches" and (README) purge: "if their number changed since the confirmation,
// it asks again".
func TestAttack11_PurgeCountChangedAsksAgain(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "purge")
	a11Dead(t, rdb, s, 3, "permanent")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	b.get("/queues/" + s + "/dead")
	code, page := b.post("/queues/"+s+"/dead/purge", url.Values{"csrf": {b.tok}}, nil)
	if code != 200 || !strings.Contains(page, "Delete 3 job(s)") {
		t.Fatalf("confirmation: %d\n%s", code, page)
	}
	form := confirmForm(t, page)
	a11Dead(t, rdb, s, 2, "permanent") // more die between confirmation and click
	code, page = b.post("/queues/"+s+"/dead/purge", form, nil)
	n, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result()
	if n != 5 {
		t.Fatalf("confirmed deleting 3 dead letters, the click deleted %d of 5 (status %d):\n%s", 5-n, code, page)
	}
	if !strings.Contains(page, "5") {
		t.Fatalf("the number changed from 3 to 5 but the page does not ask again with it:\n%s", page)
	}
}

// Promise: replay "moves at most the number confirmed".
func TestAttack11_ReplayMovesAtMostConfirmed(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "replay")
	a11Dead(t, rdb, s, 3, "exhausted")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	b.get("/queues/" + s + "/dead")
	code, page := b.post("/queues/"+s+"/dead/replay", url.Values{"csrf": {b.tok}, "rate": {"1000"}}, nil)
	if code != 200 || !strings.Contains(page, "Replay 3 job(s)") {
		t.Fatalf("confirmation: %d\n%s", code, page)
	}
	form := confirmForm(t, page)
	a11Dead(t, rdb, s, 4, "exhausted")
	code, page = b.post("/queues/"+s+"/dead/replay", form, nil)
	if code >= 400 {
		t.Fatalf("confirm: %d\n%s", code, page)
	}
	// Wait until the replay is over (its lease released), and the
	// 7 jobs all accounted for between the two streams.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ex, _ := rdb.Exists(ctx, "{"+s+"}:dlq:replay").Result() // the lease: held while the replay runs
		var mc, dc *redis.IntCmd
		rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { // one atomic read of both streams
			mc, dc = p.XLen(ctx, s), p.XLen(ctx, "{"+s+"}:dlq")
			return nil
		})
		moved, dead := mc.Val(), dc.Val()
		if moved+dead != 7 {
			t.Fatalf("jobs lost or doubled: %d replayed + %d dead != 7", moved, dead)
		}
		if ex == 0 && moved > 0 {
			if moved > 3 {
				t.Fatalf("confirmed replaying 3, the replay moved %d", moved)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay did not finish: moved %d, lease/cursor keys %d", moved, ex)
		}
		runtimeGosched()
	}
}

// Promise: "Config.ReadOnly hides them and refuses every POST" (with 403).
func TestAttack11_ReadOnlyRefusesEveryPOST(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "ro")
	a11Dead(t, rdb, s, 2, "permanent")
	rdb.ZAdd(ctx, "{"+s+"}:delayed", redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "x"})
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}, ReadOnly: true})
	_, page := b.get("/queues/" + s + "/dead")
	if strings.Contains(page, `method="post"`) {
		t.Fatalf("read-only dead page shows a POST form:\n%s", page)
	}
	ids, _ := rdb.XRange(ctx, "{"+s+"}:dlq", "-", "+").Result()
	paths := []string{"/", "/queues/" + s, "/queues/" + s + "/dead", "/queues/" + s + "/dead/purge",
		"/queues/" + s + "/dead/replay", "/queues/" + s + "/dead/" + ids[0].ID + "/delete",
		"/queues/" + s + "/dead/" + ids[0].ID, "/assets/app.js", "/nonexistent", "/queues/" + s + "/delayed/run",
		"//queues/" + s + "/dead/purge", "/queues/" + s + "/dead/purge/", "/queues/" + url.PathEscape(s) + "/dead/./purge"}
	for _, p := range paths {
		for _, form := range []url.Values{{"csrf": {b.tok}}, {"csrf": {b.tok}, "confirm": {"1"}, "rate": {"100"}, "id": {ids[0].ID}}} {
			code, body := b.post(p, form, nil)
			action := strings.HasSuffix(p, "/purge") || strings.HasSuffix(p, "/replay") || strings.HasSuffix(p, "/delete") || strings.HasSuffix(p, "/run")
			if code < 400 || (action && code != http.StatusForbidden) {
				t.Errorf("read-only POST %s %v: status %d, want 403: %.300s", p, form, code, body)
			}
		}
	}
	n, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result()
	if n != 2 {
		t.Fatalf("read-only dashboard changed the dead letters: %d left of 2", n)
	}
}

// Promise: each action "is a POST carrying a CSRF token (double submit: a
// cookie and a form field that must match), also refused when the browser
// says it is cross-origin".
func TestAttack11_CSRFOnEveryAction(t *testing.T) {
	rdb := a11Client(t)
	ctx := context.Background()
	s := a11Stream(t, rdb, "csrf")
	a11Dead(t, rdb, s, 2, "permanent")
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}})
	b.get("/queues/" + s + "/dead")
	ids, _ := rdb.XRange(ctx, "{"+s+"}:dlq", "-", "+").Result()
	actions := []string{"/queues/" + s + "/dead/purge", "/queues/" + s + "/dead/replay", "/queues/" + s + "/dead/" + ids[0].ID + "/delete"}
	good := b.tok
	type attempt struct {
		name   string
		cookie string
		field  string
		hdr    map[string]string
	}
	attempts := []attempt{
		{"no token", "", "", nil},
		{"field only", "", good, nil},
		{"cookie only", good, "", nil},
		{"mismatch", good, good + "0", nil},
		{"both empty", "", "", nil},
		{"attacker pair", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"cross-site fetch", good, good, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"cross origin", good, good, map[string]string{"Origin": "http://evil.example"}},
		{"same-site other origin", good, good, map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"null origin", good, good, map[string]string{"Origin": "null"}},
	}
	for _, a := range actions {
		for _, at := range attempts {
			b.tok = at.cookie
			code, body := b.post(a, url.Values{"csrf": {at.field}, "confirm": {"1"}, "rate": {"100"}}, at.hdr)
			if code < 400 {
				t.Errorf("%s on %s: status %d, want refused: %.300s", at.name, a, code, body)
			}
		}
	}
	n, _ := rdb.XLen(ctx, "{"+s+"}:dlq").Result()
	if n != 2 {
		t.Fatalf("forged POSTs changed the dead letters: %d left of 2", n)
	}
	if ex, _ := rdb.Exists(ctx, "{"+s+"}:dlq:replay", "{"+s+"}:dlq:replay:cursor").Result(); ex != 0 {
		t.Fatalf("a forged replay left its lease or cursor")
	}
}

// Promise: "Config.Authorize sees every request first"; ErrUnauthenticated → 401,
// any other error 403, and "the error's text is logged, never shown".
func TestAttack11_AuthorizeSeesEveryRequest(t *testing.T) {
	rdb := a11Client(t)
	s := a11Stream(t, rdb, "auth")
	a11Dead(t, rdb, s, 1, "permanent")
	var seen int
	secret := "SECRET-REASON-a11"
	deny := errors.New(secret)
	mode := 0
	b := newA11(t, rdb, dashboard.Config{Streams: []string{s}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Authorize: func(r *http.Request) error {
		seen++
		if mode == 0 {
			return fmt.Errorf("%s: %w", secret, dashboard.ErrUnauthenticated)
		}
		return deny
	}})
	paths := []string{"/", "/queues/" + s, "/queues/" + s + "/dead", "/assets/app.js", "/assets/style.css",
		"/nope", "/queues/nope", "/queues/" + s + "/dead/0-1", "/favicon.ico", "//", "/../"}
	for _, m := range []int{0, 1} {
		mode = m
		want := 401
		if m == 1 {
			want = 403
		}
		for _, p := range paths {
			for _, method := range []string{"GET", "POST", "HEAD", "OPTIONS", "PUT"} {
				before := seen
				req, _ := http.NewRequest(method, b.base+p, nil)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if seen == before {
					t.Errorf("%s %s not seen by Authorize (status %d)", method, p, res.StatusCode)
				}
				if res.StatusCode != want {
					t.Errorf("%s %s: status %d, want %d", method, p, res.StatusCode, want)
				}
				if strings.Contains(string(body), secret) || strings.Contains(fmt.Sprint(res.Header), secret) {
					t.Errorf("%s %s shows the Authorize error's text", method, p)
				}
				if res.Header.Get("Set-Cookie") != "" && res.StatusCode >= 400 {
					// not a promise, but note it
					t.Logf("%s %s: refused response sets a cookie", method, p)
				}
			}
		}
	}
}

func runtimeGosched() { runtime.Gosched() }
