package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

func TestNew_badConfig(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	for _, tc := range []struct {
		cfg   dashboard.Config
		field string
	}{
		{dashboard.Config{PageSize: -1}, "Config.PageSize"},
		{dashboard.Config{PageSize: 5000}, "Config.PageSize"},
		{dashboard.Config{ReasonScan: -1}, "Config.ReasonScan"},
		{dashboard.Config{StuckAfter: -time.Second}, "Config.StuckAfter"},
		{dashboard.Config{TraceURL: "javascript:alert(1)//{trace_id}"}, "Config.TraceURL"},
		{dashboard.Config{Streams: []string{""}}, "Config.Streams"},
	} {
		_, err := dashboard.New(rdb, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}

func TestOverview_queues(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	ctx := context.Background()
	b.enqueue("email.send", 7)
	b.rdb.XGroupCreate(ctx, b.stream, "senders", "0")
	b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "senders", Consumer: "c1", Streams: []string{b.stream, ">"}, Count: 2})
	b.addDead("email.send", "{}", "", "permanent", "bad address")
	b.addDead("email.send", "{}", "", "exhausted", "timeout")
	b.addDead("email.send", "{}", "", "exhausted", "timeout")

	code, body := b.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	// Length 7, lag 5, pending 2, dead 3 by reason, 1 consumer.
	mustContain(t, body, b.stream, `<td class="n">7</td>`, `<td class="n">5</td>`, `<td class="n">2</td>`,
		">exhausted 2<", ">permanent 1<", `<td class="n">1</td>`, "/jobs/queues/"+b.q()+"/dead")
	mustNotContain(t, body, "(newest ") // all 3 dead letters counted
}

func TestOverview_reasonScanCapSaid(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{ReasonScan: 2})
	b.enqueue("a", 1)
	for range 3 {
		b.addDead("a", "{}", "", "panic", "boom")
	}
	_, body := b.get("/")
	mustContain(t, body, ">panic 2<", "(newest 2)")
}

func TestOverview_scanFindsStreams(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	b := setupNamed(t, rdb, name, dashboard.Config{Streams: []string{}}) // empty: SCAN
	b.enqueue("a", 1)
	_, body := b.get("/")
	mustContain(t, body, name)
	mustNotContain(t, body, b.keys.Dead+"<") // dead-letter streams are not queues
}

func TestQueue_page(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{StuckAfter: time.Millisecond})
	ctx := context.Background()
	b.enqueue("report.build", 3)
	b.rdb.XGroupCreate(ctx, b.stream, "builders", "0")
	b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "builders", Consumer: "worker-7", Streams: []string{b.stream, ">"}, Count: 1})
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.stream})
	j, _ := stream.NewJSONJob("report.later", map[string]int{})
	j.ID = "later-1"
	if err := p.EnqueueIn(ctx, j, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Stuck means idle over StuckAfter (1 ms): poll until XPENDING says so.
	eventually(t, "the entry is idle", func() bool {
		ps, _ := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: "builders", Idle: 2 * time.Millisecond, Start: "-", End: "+", Count: 1}).Result()
		return len(ps) == 1
	})
	code, body := b.get("/queues/" + b.q())
	if code != http.StatusOK {
		t.Fatalf("GET queue = %d:\n%s", code, body)
	}
	mustContain(t, body, "builders", "worker-7", "report.build", // group, consumer, stuck job type
		"report.later", "later-1", "Run now", // delayed job
		"Recent entries")
	if strings.Count(body, "report.build") < 4 { // 1 stuck + 3 recent
		t.Errorf("want the stuck job and 3 recent entries of report.build:\n%s", body)
	}
}

func TestDead_filterAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{PageSize: 2})
	b.enqueue("x", 1)
	for range 3 {
		b.addDead("invoice.send", "{}", "", "permanent", "card declined")
	}
	b.addDead("invoice.send", "{}", "", "exhausted", "smtp timeout")
	b.addDead("email.send", "{}", "", "exhausted", "smtp timeout")

	_, body := b.get("/queues/" + b.q() + "/dead?reason=exhausted&type=email.send")
	if n := strings.Count(body, `<span class="badge reason">exhausted`); n != 1 {
		t.Errorf("type+reason filter: %d rows, want 1", n)
	}
	_, body = b.get("/queues/" + b.q() + "/dead?error=declined")
	if n := strings.Count(body, "card declined"); n != 2 { // page size 2
		t.Errorf("error filter page 1: %d rows, want 2", n)
	}
	i := strings.Index(body, `id="next" href="`)
	if i < 0 {
		t.Fatalf("no next page link:\n%s", body)
	}
	href := body[i+len(`id="next" href="`):]
	href = strings.ReplaceAll(href[:strings.IndexByte(href, '"')], "&amp;", "&")
	_, body = b.get(strings.TrimPrefix(href, "/jobs"))
	if n := strings.Count(body, "card declined"); n != 1 {
		t.Errorf("error filter page 2: %d rows, want 1", n)
	}
	code, _ := b.get("/queues/" + b.q() + "/dead?since=yesterday")
	if code != http.StatusBadRequest {
		t.Errorf("bad since: %d, want 400", code)
	}
	// A time range: everything was dead-lettered before tomorrow.
	tomorrow := time.Now().UTC().Add(24 * time.Hour).Format("2006-01-02")
	_, body = b.get("/queues/" + b.q() + "/dead?until=" + tomorrow + "&reason=permanent")
	if n := strings.Count(body, "card declined"); n != 2 {
		t.Errorf("until filter: %d rows, want 2", n)
	}
	_, body = b.get("/queues/" + b.q() + "/dead?since=" + tomorrow)
	mustContain(t, body, "No dead letters")
}

func TestDead_entryDecodesPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{TraceURL: "https://tempo.example/trace/{trace_id}"})
	b.enqueue("x", 1)
	jsonID := b.addDead("a", `{"to":"ana@example.com","n":[1,2]}`, "application/json", "permanent", "bad",
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"error_history", `["first failure","second failure"]`)
	mp, _ := msgpack.Marshal(map[string]any{"customer": "c-42", "amount": 1999})
	mpID := b.addDead("b", string(mp), "application/msgpack", "exhausted", "x")

	_, body := b.get("/queues/" + b.q() + "/dead/" + jsonID)
	mustContain(t, body, "&#34;to&#34;: &#34;ana@example.com&#34;", // indented JSON, escaped
		`href="https://tempo.example/trace/0af7651916cd43dd8448eb211c80319c"`, "first failure", "second failure")
	_, body = b.get("/queues/" + b.q() + "/dead/" + mpID)
	mustContain(t, body, "msgpack, shown as JSON", "&#34;customer&#34;: &#34;c-42&#34;", "&#34;amount&#34;: 1999")
}

func TestDead_hostileEntryEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{MaxValueBytes: 1000})
	b.enqueue("x", 1)
	evil := `<script>alert("x")</script>"'><img src=x onerror=alert(1)>`
	id := b.addDead(evil, `{"html":"</pre><script>alert(2)</script>"}`, "", evil, evil,
		"traceparent", `00-"><script>alert(3)</script>-b7ad6b7169203331-01`)
	big := b.addDead("big", `"`+strings.Repeat("A", 5<<20)+`"`, "", "permanent", "too big")

	for _, path := range []string{"/", "/queues/" + b.q() + "/dead", "/queues/" + b.q() + "/dead/" + id} {
		_, body := b.get(path)
		mustNotContain(t, body, "<script>alert", "<img src=x")
		if path != "/" {
			mustContain(t, body, "&lt;script&gt;alert(")
		}
	}
	_, body := b.get("/queues/" + b.q() + "/dead/" + big)
	if len(body) > 100<<10 {
		t.Errorf("the 5 MB payload's page is %d bytes: not cut", len(body))
	}
	mustContain(t, body, "Cut: showing the first part of 5.0 MiB")
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	for _, path := range []string{"/queues/" + b.q(), "/queues/" + b.q() + "/dead", "/queues/" + b.q() + "/dead/1-1",
		"/queues/%7Bbad", "/nowhere"} {
		if code, _ := b.get(path); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, code)
		}
	}
	b.enqueue("x", 1)
	if code, _ := b.get("/queues/" + b.q() + "/dead/1-1"); code != http.StatusNotFound {
		t.Errorf("unknown dead letter = %d, want 404", code)
	}
}

func TestStreamNameWithSlash(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t) + "/a b?c"
	b := setupNamed(t, rdb, name, dashboard.Config{})
	b.enqueue("x", 2)
	b.addDead("x", "{}", "", "permanent", "e")
	code, body := b.get("/queues/" + b.q())
	if code != http.StatusOK {
		t.Fatalf("GET queue %q = %d", name, code)
	}
	mustContain(t, body, "/jobs/queues/"+b.q()+"/dead")
	if code, _ := b.get("/queues/" + b.q() + "/dead"); code != http.StatusOK {
		t.Fatalf("GET dead of %q = %d", name, code)
	}
}

func TestActions_replayMovesJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	ctx := context.Background()
	b.enqueue("x", 1)
	for range 3 {
		b.addDead("invoice.send", "{}", "", "exhausted", "timeout")
	}
	b.addDead("other", "{}", "", "permanent", "no")
	path := "/queues/" + b.q() + "/dead/replay"
	filter := url.Values{"reason": {"exhausted"}, "rate": {"1000"}}

	code, body, _ := b.post(path, cloneValues(filter))
	if code != http.StatusOK {
		t.Fatalf("first POST = %d:\n%s", code, body)
	}
	mustContain(t, body, "Replay 3 job(s)", `name="confirm" value="3"`)
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 4 {
		t.Fatalf("the confirmation wrote: %d dead letters left, want 4", n)
	}
	v := cloneValues(filter)
	v.Set("confirm", "3")
	code, _, loc := b.post(path, v)
	if code != http.StatusSeeOther {
		t.Fatalf("confirmed POST = %d", code)
	}
	eventually(t, "3 jobs are back in the stream", func() bool {
		n, _ := b.rdb.XLen(ctx, b.stream).Result()
		return n == 4
	})
	_, body = b.get(strings.TrimPrefix(loc, "/jobs"))
	eventually(t, "the page says the replay is done", func() bool {
		_, body = b.get(strings.TrimPrefix(loc, "/jobs"))
		return strings.Contains(body, "Replay done")
	})
	mustContain(t, body, "3 job(s) moved back")
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 1 {
		t.Errorf("%d dead letters left, want 1 (the other reason)", n)
	}
}

func TestActions_replayMovesAtMostTheConfirmedCount(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	ctx := context.Background()
	b.enqueue("x", 1)
	for range 3 {
		b.addDead("a", "{}", "", "exhausted", "e")
	}
	_, _, _ = b.post("/queues/"+b.q()+"/dead/replay", url.Values{"confirm": {"2"}})
	eventually(t, "the replay ends", func() bool {
		_, body := b.get("/queues/" + b.q() + "/dead")
		return strings.Contains(body, "Replay done")
	})
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 1 {
		t.Errorf("%d dead letters left, want 1: a replay confirmed for 2 moves 2", n)
	}
}

func TestActions_purgeDeleteRunNow(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	ctx := context.Background()
	b.enqueue("x", 1)
	keep := b.addDead("a", "{}", "", "exhausted", "e")
	b.addDead("a", "{}", "", "permanent", "e")
	b.addDead("a", "{}", "", "permanent", "e")

	// Purge: the confirmation counts; a stale count asks again.
	_, body, _ := b.post("/queues/"+b.q()+"/dead/purge", url.Values{"reason": {"permanent"}})
	mustContain(t, body, "Delete 2 dead letter(s)")
	_, body, _ = b.post("/queues/"+b.q()+"/dead/purge", url.Values{"reason": {"permanent"}, "confirm": {"5"}})
	mustContain(t, body, "changed since you confirmed")
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 3 {
		t.Fatalf("a stale confirmation purged: %d left", n)
	}
	code, _, _ := b.post("/queues/"+b.q()+"/dead/purge", url.Values{"reason": {"permanent"}, "confirm": {"2"}})
	if code != http.StatusSeeOther {
		t.Fatalf("purge = %d", code)
	}
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 1 {
		t.Fatalf("after purge: %d left, want 1", n)
	}

	// Delete one.
	_, body, _ = b.post("/queues/"+b.q()+"/dead/"+keep+"/delete", nil)
	mustContain(t, body, "Delete 1 dead letter ("+keep+")")
	b.post("/queues/"+b.q()+"/dead/"+keep+"/delete", url.Values{"confirm": {"1"}})
	if n, _ := b.rdb.XLen(ctx, b.keys.Dead).Result(); n != 0 {
		t.Fatalf("after delete: %d left, want 0", n)
	}

	// Run a delayed job now: due at once, then promoted as any due job.
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.stream})
	j, _ := stream.NewJSONJob("later", map[string]int{})
	j.ID = "later-1"
	if err := p.EnqueueIn(ctx, j, time.Hour); err != nil {
		t.Fatal(err)
	}
	zs, _ := b.rdb.ZRangeWithScores(ctx, b.keys.Delayed, 0, -1).Result()
	score := strings.TrimSuffix(strings.TrimSuffix(redisFloat(zs[0].Score), ".0"), "")
	form := url.Values{"key": {"later-1"}, "score": {score}}
	_, body, _ = b.post("/queues/"+b.q()+"/delayed/run", cloneValues(form))
	mustContain(t, body, "Make 1 delayed job(s)")
	form.Set("confirm", "1")
	if code, _, _ := b.post("/queues/"+b.q()+"/delayed/run", form); code != http.StatusSeeOther {
		t.Fatalf("run now = %d", code)
	}
	if n, err := stream.PromoteDue(ctx, b.rdb, b.stream, 10); err != nil || n != 1 {
		t.Fatalf("PromoteDue after run now = %d, %v; want 1", n, err)
	}
}

func TestActions_csrfRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{})
	b.enqueue("x", 1)
	b.addDead("a", "{}", "", "exhausted", "e")
	path := "/queues/" + b.q() + "/dead/purge"
	for name, v := range map[string]url.Values{
		"no token":    {"csrf": {""}, "confirm": {"1"}},
		"wrong token": {"csrf": {strings.Repeat("0", 32)}, "confirm": {"1"}},
	} {
		b.csrf()
		if code, _, _ := b.post(path, v); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
	}
	// A cross-site browser request is refused even with the token.
	req, _ := http.NewRequest("POST", b.url(path), strings.NewReader(url.Values{"csrf": {b.csrf()}, "confirm": {"1"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site: %d, want 403", res.StatusCode)
	}
	if n, _ := b.rdb.XLen(context.Background(), b.keys.Dead).Result(); n != 1 {
		t.Errorf("a refused POST purged: %d left", n)
	}
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{ReadOnly: true})
	b.enqueue("x", 1)
	id := b.addDead("a", "{}", "", "exhausted", "e")
	for _, path := range []string{"/queues/" + b.q() + "/dead", "/queues/" + b.q() + "/dead/" + id, "/queues/" + b.q()} {
		_, body := b.get(path)
		mustNotContain(t, body, `method="post"`)
		mustContain(t, body, "read-only")
	}
	for _, path := range []string{"/dead/replay", "/dead/purge", "/dead/" + id + "/delete", "/delayed/run"} {
		if code, _, _ := b.post("/queues/"+b.q()+path, url.Values{"confirm": {"1"}}); code != http.StatusForbidden {
			t.Errorf("POST %s = %d, want 403", path, code)
		}
	}
	if n, _ := b.rdb.XLen(context.Background(), b.keys.Dead).Result(); n != 1 {
		t.Errorf("read-only dashboard changed the DLQ: %d left", n)
	}
}

func TestAuthorize(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{Authorize: func(r *http.Request) error {
		switch r.Header.Get("X-User") {
		case "":
			return dashboard.ErrUnauthenticated
		case "ops":
			return nil
		default:
			return errors.New("not an operator: secret detail")
		}
	}})
	b.enqueue("x", 1)
	for user, want := range map[string]int{"": 401, "guest": 403, "ops": 200} {
		for _, path := range []string{"/", "/assets/style.css", "/queues/" + b.q()} {
			req, _ := http.NewRequest("GET", b.url(path), nil)
			if user != "" {
				req.Header.Set("X-User", user)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var buf strings.Builder
			_, _ = bufCopy(&buf, res)
			if res.StatusCode != want {
				t.Errorf("user %q GET %s = %d, want %d", user, path, res.StatusCode, want)
			}
			if strings.Contains(buf.String(), "secret detail") {
				t.Errorf("the hook's error text reached the response")
			}
		}
	}
}
