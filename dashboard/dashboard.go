package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of [Config].
const (
	// DefaultMaxValueBytes is how many bytes of a field or payload a page
	// shows.
	DefaultMaxValueBytes = 64 << 10
	// DefaultPageSize is how many entries a list shows per page.
	DefaultPageSize = 50
	// DefaultReasonScan is how many of a queue's newest dead letters the
	// overview counts by reason. Counting costs Redis about 20 µs per
	// dead letter of 1 KiB (BenchmarkOverview), so the overview of 100
	// queues stays fast with it.
	DefaultReasonScan = 100
	// DefaultReplayRate is the replay rate, in jobs per second, that the
	// replay form proposes.
	DefaultReplayRate = 100
	// DefaultStreamsTTL is how long the list of streams found by SCAN is
	// reused.
	DefaultStreamsTTL = 30 * time.Second
	// DefaultStuckAfter is how long an entry must have been pending to be
	// shown as stuck.
	DefaultStuckAfter = time.Minute
)

// ErrUnauthenticated is what an Authorize hook returns (or wraps) for a
// request without valid credentials: the dashboard answers 401. Any other
// error answers 403.
var ErrUnauthenticated = errors.New("dashboard: unauthenticated")

// Config configures a [Dashboard]. The zero value is valid: every stream
// of the database, actions allowed, no authorization (put the handler
// behind the host service's own).
type Config struct {
	// Authorize, if set, is called for every request before anything else;
	// an error refuses it, with 401 if it wraps [ErrUnauthenticated] and
	// 403 otherwise. The error's text is logged, never shown.
	Authorize func(*http.Request) error
	// Logger receives Redis errors. Defaults to slog.Default().
	Logger *slog.Logger
	// MaxValueBytes is how many bytes of one field value or decoded
	// payload a page shows; longer ones are cut and marked. Defaults to
	// [DefaultMaxValueBytes].
	MaxValueBytes int
	// Partitions names the partitioned queues (stream.Partitions) to show,
	// each as one queue: queue name to partition count, as
	// metrics.PartitionedQueue and pelican's --partitions take them. The
	// overview has one row per queue (its figures summed over its
	// partitions), the queue page a per-partition breakdown, and the
	// dead-letter page lists and operates the dead letters of every
	// partition as one (dlq.Partitioned). They are shown besides
	// Config.Streams, or the streams SCAN finds (their partition streams
	// then left out). Defaults to none.
	Partitions map[string]int
	// PageSize is how many dead letters, stuck, delayed and recent jobs a
	// page lists. Defaults to [DefaultPageSize].
	PageSize int
	// ReadOnly hides every action and refuses every POST with 403.
	ReadOnly bool
	// ReasonScan is how many of each queue's newest dead letters are
	// counted by reason on the overview (the page says when there are
	// more). Defaults to [DefaultReasonScan].
	ReasonScan int
	// ReplayRate is the rate, in jobs per second, that the replay form
	// proposes. Defaults to [DefaultReplayRate].
	ReplayRate float64
	// Streams, if set, are the only queues shown, and no SCAN is sent;
	// otherwise the dashboard lists every stream of the database (not the
	// dead-letter streams) with SCAN, at most once per StreamsTTL.
	Streams []string
	// StreamsTTL is how long the list of streams found by SCAN is reused.
	// Defaults to [DefaultStreamsTTL].
	StreamsTTL time.Duration
	// StuckAfter is how long an entry must have been pending (idle) to be
	// listed as stuck on the queue page. Defaults to [DefaultStuckAfter].
	StuckAfter time.Duration
	// TraceURL, if set, turns trace IDs into links: "{trace_id}" in it is
	// replaced by the job's trace ID, as in
	// "http://jaeger:16686/trace/{trace_id}". It must be an http or https
	// URL.
	TraceURL string
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	switch {
	case c.MaxValueBytes < 0:
		return fmt.Errorf("dashboard: Config.MaxValueBytes (%d) must not be negative", c.MaxValueBytes)
	case c.PageSize < 0:
		return fmt.Errorf("dashboard: Config.PageSize (%d) must not be negative", c.PageSize)
	case c.PageSize > 1000:
		return fmt.Errorf("dashboard: Config.PageSize (%d) must be at most 1000", c.PageSize)
	case c.ReasonScan < 0:
		return fmt.Errorf("dashboard: Config.ReasonScan (%d) must not be negative", c.ReasonScan)
	case c.ReplayRate < 0 || math.IsNaN(c.ReplayRate) || math.IsInf(c.ReplayRate, 0):
		return fmt.Errorf("dashboard: Config.ReplayRate (%v) must be a non-negative number", c.ReplayRate)
	case c.StreamsTTL < 0:
		return fmt.Errorf("dashboard: Config.StreamsTTL (%v) must not be negative", c.StreamsTTL)
	case c.StuckAfter < 0:
		return fmt.Errorf("dashboard: Config.StuckAfter (%v) must not be negative", c.StuckAfter)
	}
	for _, s := range c.Streams {
		if s == "" {
			return errors.New("dashboard: Config.Streams holds an empty name")
		}
	}
	if err := validPartitions(c.Partitions); err != nil {
		return err
	}
	if c.TraceURL != "" {
		u, err := url.Parse(strings.ReplaceAll(c.TraceURL, "{trace_id}", "0"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("dashboard: Config.TraceURL (%q) must be an http or https URL", c.TraceURL)
		}
	}
	return nil
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Dashboard is the web dashboard: an http.Handler to mount under any
// prefix. It is safe for concurrent use. Close stops the replays it
// started.
type Dashboard struct {
	rdb   redis.UniversalClient
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
	cop   *http.CrossOriginProtection

	parts  map[string][]string // Config.Partitions' streams
	partOf map[string]bool     // every partition stream of parts

	streamsMu sync.Mutex
	streams   []string
	streamsAt time.Time
	denied    bool

	rates *rates

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	replays *replays
}

// New returns the dashboard of the queues on rdb. It fails, naming the
// field, if cfg is invalid; it sends no command.
func New(rdb redis.UniversalClient, cfg Config) (*Dashboard, error) {
	if rdb == nil {
		return nil, errors.New("dashboard: nil Redis client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxValueBytes == 0 {
		cfg.MaxValueBytes = DefaultMaxValueBytes
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.ReasonScan == 0 {
		cfg.ReasonScan = DefaultReasonScan
	}
	if cfg.ReplayRate == 0 {
		cfg.ReplayRate = DefaultReplayRate
	}
	if cfg.StreamsTTL == 0 {
		cfg.StreamsTTL = DefaultStreamsTTL
	}
	if cfg.StuckAfter == 0 {
		cfg.StuckAfter = DefaultStuckAfter
	}
	d := &Dashboard{rdb: rdb, cfg: cfg, log: cfg.Logger, cop: http.NewCrossOriginProtection(), rates: newRates(), replays: newReplays()}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	var err error
	if d.parts, err = partitionNames(cfg.Partitions); err != nil {
		return nil, err
	}
	d.partOf = map[string]bool{}
	for _, ss := range d.parts {
		for _, s := range ss {
			d.partOf[s] = true
		}
	}
	if d.pages, err = parseTemplates(); err != nil {
		return nil, err
	}
	d.routes()
	return d, nil
}

// Close cancels the replays this dashboard started and waits for them to
// stop; each can be resumed later (see dlq.DLQ.Replay). The handler keeps
// serving pages, but refuses new replays.
func (d *Dashboard) Close() error {
	d.cancel()
	d.wg.Wait()
	return nil
}

func (d *Dashboard) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", d.overview)
	m.HandleFunc("GET /queues/{queue}", d.queue)
	m.HandleFunc("GET /queues/{queue}/dead", d.deadList)
	m.HandleFunc("GET /queues/{queue}/dead/{id}", d.deadEntry)
	m.HandleFunc("POST /queues/{queue}/dead/replay", d.post(d.replay))
	m.HandleFunc("POST /queues/{queue}/dead/purge", d.post(d.purge))
	m.HandleFunc("POST /queues/{queue}/dead/{id}/delete", d.post(d.deleteOne))
	m.HandleFunc("POST /queues/{queue}/delayed/run", d.post(d.runNow))
	m.HandleFunc("POST /queues/{queue}/pause", d.post(d.pause))
	m.HandleFunc("POST /queues/{queue}/resume", d.post(d.resume))
	assets, _ := fs.Sub(assetFS, "assets")
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	d.mux = m
}

// ServeHTTP serves the dashboard's pages, assets and actions.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if d.cfg.Authorize != nil {
		if err := d.cfg.Authorize(r); err != nil {
			code := http.StatusForbidden
			if errors.Is(err, ErrUnauthenticated) {
				code = http.StatusUnauthorized
			}
			d.log.Info("dashboard: request refused", "path", r.URL.Path, "error", err.Error())
			http.Error(w, http.StatusText(code), code)
			return
		}
	}
	if !strings.HasPrefix(r.URL.Path, "/assets/") {
		h.Set("Cache-Control", "no-store")
	}
	d.mux.ServeHTTP(w, r)
}

// csrfCookie is the name of the cookie holding the CSRF token; every form
// carries the same token in its csrf field (double submit), and a POST
// whose two differ is refused.
const csrfCookie = "pelican_csrf"

// csrfToken returns the request's CSRF token, setting the cookie if the
// request has none.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		return c.Value
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: basePath(r) + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return tok
}

// post wraps an action: read-only refusal, cross-origin and CSRF checks,
// bounded body.
func (d *Dashboard) post(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.cfg.ReadOnly {
			http.Error(w, "the dashboard is read-only", http.StatusForbidden)
			return
		}
		if err := d.cop.Check(r); err != nil {
			http.Error(w, "cross-origin request refused", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		c, err := r.Cookie(csrfCookie)
		sent := r.PostForm.Get("csrf")
		if err != nil || len(c.Value) != 32 || subtle.ConstantTimeCompare([]byte(c.Value), []byte(sent)) != 1 {
			http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
			return
		}
		fn(w, r)
	}
}

// basePath returns the prefix the dashboard is mounted under ("" at the
// root): what http.StripPrefix removed from the request's path.
func basePath(r *http.Request) string {
	orig := r.RequestURI
	if i := strings.IndexByte(orig, '?'); i >= 0 {
		orig = orig[:i]
	}
	if u, err := url.Parse(orig); err == nil && u.Path != "" {
		orig = u.EscapedPath()
	}
	if p, ok := strings.CutSuffix(orig, r.URL.EscapedPath()); ok {
		return strings.TrimSuffix(p, "/")
	}
	return ""
}

// link joins the base path and escaped path segments.
func link(base string, segs ...string) string {
	var b strings.Builder
	b.WriteString(base)
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	if len(segs) == 0 {
		b.WriteByte('/')
	}
	return b.String()
}

// page is what every template gets.
type page struct {
	Title    string
	Base     string
	CSRF     string
	ReadOnly bool
	Refresh  bool // offer auto-refresh
	Now      time.Time
	Data     any
}

func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, code int, name, title string, refresh bool, data any) {
	p := page{Title: title, Base: basePath(r), CSRF: d.csrfToken(w, r), ReadOnly: d.cfg.ReadOnly, Refresh: refresh, Now: time.Now(), Data: data}
	var buf strings.Builder
	if err := d.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		d.log.Error("dashboard: render", "page", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(buf.String()))
}

// fail renders an error page; err's text is shown (Redis errors hold no
// payloads).
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, code int, msg string, err error) {
	if err != nil {
		d.log.Warn("dashboard: "+msg, "path", r.URL.Path, "error", err)
		msg += ": " + err.Error()
	}
	d.render(w, r, code, "error", http.StatusText(code), false, msg)
}
