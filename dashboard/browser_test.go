package dashboard_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/stream"
)

// The browser test drives a real headless Chromium (Debian's chromium,
// which scripts/test.sh installs). It skips only when no Chromium is found
// and CI is unset; on CI a missing browser fails the test.

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium on PATH (chromium, chromium-browser, google-chrome; or set CHROMIUM): scripts/test.sh installs Debian's chromium")
	}
	t.Skip("no Chromium on PATH and CI unset: skipping the browser test (scripts/test.sh installs chromium)")
	return ""
}

// browser starts a headless Chromium and returns its context; dialogs
// counts every JavaScript dialog a page opened (each is dismissed).
func browser(t *testing.T) (ctx context.Context, dialogs *atomic.Int32) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // tests may run as root
		chromedp.WindowSize(1440, 900),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("font-render-hinting", "none"),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	dialogs = new(atomic.Int32)
	opened := make(chan struct{}, 16)
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			select {
			case opened <- struct{}{}:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	go func() { // dismiss dialogs, or the page would hang on them
		for {
			select {
			case <-ctx.Done():
				return
			case <-opened:
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
			}
		}
	}()
	// Start the browser now, with a bound: a browser that cannot start
	// fails here, not in a later step.
	sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
	defer scancel()
	if err := chromedp.Do(sctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx, dialogs
}

// screenshot saves a full-page PNG of the current page as name in
// $DASHBOARD_SCREENSHOTS (or the test's temporary directory).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("DASHBOARD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Text(sel))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// filterDead opens the dead-letter page dead, types typ and errText into
// its filter and applies it, and waits until the filtered page has loaded.
// The click's navigation starts later, in Chromium: a WaitVisible after the
// click can find the table of the page still shown, unfiltered (on a busy
// machine it did: 6 rows, the URL without the filter). And the page's
// auto-refresh, a reload every 5 s, can come first and load the page
// unfiltered, the typed values gone: then the filter is applied again.
func filterDead(t *testing.T, ctx context.Context, dead, typ, errText string) {
	t.Helper()
	for try := 1; ; try++ {
		step(t, ctx, "open the dead letters", chromedp.Navigate(dead), chromedp.WaitVisible("#dead"),
			chromedp.SendKeys(`input[name="type"]`, typ), chromedp.SendKeys(`input[name="error"]`, errText))
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := chromedp.RunResponse(sctx, chromedp.Click("#apply"))
		cancel()
		if err != nil {
			t.Fatalf("apply the filter: %v", err)
		}
		loc, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		if u, _ := url.Parse(loc); u.Query().Get("type") == typ && u.Query().Get("error") == errText {
			step(t, ctx, "show the filtered dead letters", chromedp.WaitVisible("#dead"))
			return
		}
		if try == 3 {
			t.Fatalf("applying the filter %d times loaded %s, without the filter", try, loc)
		}
		t.Logf("the page loaded without the filter (%s): its auto-refresh came first; again", loc)
	}
}

func evalInt(t *testing.T, ctx context.Context, js string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return n
}

// TestBrowser_replayFromTheDeadLetterPage runs a consumer whose handler
// fails permanently until "fixed", lets five jobs die, then, in Chromium:
// opens the overview, filters the dead letters, replays them through the
// confirmation, and checks that the jobs run; it opens a hostile entry and
// checks that no script ran. It saves a screenshot of each page.
func TestBrowser_replayFromTheDeadLetterPage(t *testing.T) {
	t.Parallel()
	ctx, dialogs := browser(t)
	b := setup(t, dashboard.Config{StuckAfter: time.Millisecond})

	var broken atomic.Bool
	broken.Store(true)
	var mu sync.Mutex
	ran := map[string]bool{}
	mux := consumer.NewMux().HandleFunc("invoice.send", func(ctx context.Context, j *stream.Job) error {
		if broken.Load() {
			return consumer.Permanent(errors.New("card declined: gateway said no"))
		}
		mu.Lock()
		ran[j.ID] = true
		mu.Unlock()
		return nil
	})
	cctx, stop := context.WithCancel(context.Background())
	c := consumer.New(b.rdb, consumer.Config{Stream: b.stream, Group: "billing"}).Handle(mux)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: b.stream})
	for i := range 5 {
		j, _ := stream.NewJob("invoice.send", map[string]any{"invoice": i, "amount_cents": 1999 + i, "customer": "c-42"})
		if _, err := p.Enqueue(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	later, _ := stream.NewJSONJob("invoice.remind", map[string]string{"customer": "c-42"})
	if err := p.EnqueueIn(context.Background(), later, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "5 jobs are dead", func() bool {
		n, _ := b.rdb.XLen(context.Background(), b.keys.Dead).Result()
		return n == 5
	})
	// A hostile producer's entry, dead-lettered with its raw fields.
	evil := b.addDead(`<img src=x onerror="alert('type')">`, `{"note":"</pre><script>alert('payload')</script>"}`, "",
		`<script>alert('reason')</script>`, `"><svg onload=alert('error')>`)

	base := b.url("")
	dead := base + "/queues/" + b.q() + "/dead"

	step(t, ctx, "open the overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible("table.grid"))
	if s := text(t, ctx, "table.grid"); !strings.Contains(s, b.stream) || !strings.Contains(s, "permanent 5") {
		t.Fatalf("overview lacks the queue or its dead letters:\n%s", s)
	}
	screenshot(t, ctx, "overview.png")

	step(t, ctx, "open the queue", chromedp.Navigate(base+"/queues/"+b.q()), chromedp.WaitVisible("h1"))
	if s := text(t, ctx, "main"); !strings.Contains(s, "billing") || !strings.Contains(s, "invoice.remind") {
		t.Fatalf("queue page lacks the group or the delayed job:\n%s", s)
	}
	screenshot(t, ctx, "queue.png")

	filterDead(t, ctx, dead, "invoice.send", "declined")
	if n := evalInt(t, ctx, `document.querySelectorAll("#dead tbody tr").length`); n != 5 {
		t.Fatalf("filtered list shows %d rows, want 5", n)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	if u, _ := url.Parse(loc); u.Query().Get("type") != "invoice.send" {
		t.Fatalf("the filter is not in the URL: %s", loc)
	}
	screenshot(t, ctx, "dead-letters.png")

	broken.Store(false) // the fix is deployed: replay
	step(t, ctx, "ask to replay", chromedp.Click("#replay-btn"), chromedp.WaitVisible("#question"))
	if q := text(t, ctx, "#question"); !strings.Contains(q, "Replay 5 job(s)") {
		t.Fatalf("confirmation says %q, want it to state 5 jobs", q)
	}
	screenshot(t, ctx, "confirm-replay.png")
	step(t, ctx, "confirm the replay", chromedp.Click("#confirm-btn"), chromedp.WaitVisible("#message"))
	eventually(t, "the 5 replayed jobs ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 5
	})
	if n, _ := b.rdb.XLen(context.Background(), b.keys.Dead).Result(); n != 1 {
		t.Errorf("%d dead letters left, want 1 (the hostile one, not matched)", n)
	}
	step(t, ctx, "reload the dead letters", chromedp.Navigate(dead), chromedp.WaitVisible("#replay"))
	if s := text(t, ctx, "#replay"); !strings.Contains(s, "Replay done") || !strings.Contains(s, "5 job(s) moved back") {
		t.Errorf("replay box says %q", s)
	}

	step(t, ctx, "open the hostile entry", chromedp.Navigate(dead+"/"+evil), chromedp.WaitVisible("#payload"))
	if s := text(t, ctx, "#payload"); !strings.Contains(s, "<script>alert('payload')</script>") {
		t.Errorf("the hostile payload is not shown as text: %q", s)
	}
	screenshot(t, ctx, "job.png")
	step(t, ctx, "list with the hostile entry", chromedp.Navigate(dead), chromedp.WaitVisible("#dead"))
	if n := evalInt(t, ctx, `document.querySelectorAll("main script, main img, main svg").length`); n != 0 {
		t.Errorf("%d elements from hostile fields became markup", n)
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialog(s) opened: a hostile field ran as script", n)
	}
}

// TestBrowser_pauseAndResume pauses a job type from the queue page for ten
// minutes, through the confirmation, in Chromium, checks the pause in Redis
// and on the page, and resumes it with its button.
func TestBrowser_pauseAndResume(t *testing.T) {
	t.Parallel()
	ctx, _ := browser(t)
	b := setup(t, dashboard.Config{})
	t.Cleanup(func() { b.rdb.Del(context.Background(), b.keys.Paused) })
	b.enqueue("invoice.send", 1)
	qp := b.url("/queues/" + b.q())

	step(t, ctx, "ask to pause a type", chromedp.Navigate(qp), chromedp.WaitVisible("#pause-form"),
		chromedp.SendKeys(`#pause-form input[name="type"]`, "invoice.send"),
		chromedp.SendKeys(`#pause-form input[name="for"]`, "10m"),
		chromedp.Click("#pause-btn"), chromedp.WaitVisible("#question"))
	if q := text(t, ctx, "#question"); !strings.Contains(q, `type "invoice.send"`) || !strings.Contains(q, "for 10m") {
		t.Fatalf("confirmation says %q", q)
	}
	step(t, ctx, "confirm the pause", chromedp.Click("#confirm-btn"), chromedp.WaitVisible("#pauses"))
	st, err := control.State(context.Background(), b.rdb, b.stream)
	if until, ok := st.Types["invoice.send"]; err != nil || !ok || until.IsZero() || st.Queue {
		t.Fatalf("after the pause: %+v, %v", st, err)
	}
	if s := text(t, ctx, "#pauses"); !strings.Contains(s, "type invoice.send") {
		t.Errorf("pauses table says %q", s)
	}
	screenshot(t, ctx, "queue-paused.png")
	step(t, ctx, "ask to resume", chromedp.Click(".resume-btn"), chromedp.WaitVisible("#question"))
	step(t, ctx, "confirm the resume", chromedp.Click("#confirm-btn"), chromedp.WaitVisible("#no-pauses"))
	if st, _ := control.State(context.Background(), b.rdb, b.stream); st.Any() {
		t.Errorf("after the resume: %+v", st)
	}
}
