package dlq

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/perm"
	"github.com/pelicanqueue/pelican/stream"
)

var (
	//go:embed move.lua
	moveLua    string
	moveScript = redis.NewScript(moveLua)

	//go:embed cursor.lua
	cursorLua    string
	cursorScript = redis.NewScript(cursorLua)

	//go:embed renew.lua
	renewLua    string
	renewScript = redis.NewScript(renewLua)

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)
)

// DefaultProgressInterval is the least time between two progress reports of
// Replay and Purge.
const DefaultProgressInterval = 500 * time.Millisecond

// ReplayOptions configures one [DLQ.Replay].
type ReplayOptions struct {
	// BeforeMove, if set, is called from Replay's goroutine for each
	// matching entry just before it is moved, under the replay's lease (not
	// in a dry run): to prepare what the replayed job will meet, such as
	// forgetting its failed idempotency record (idem.Store.Forget). An error
	// stops the replay with that error before the entry moves; the entry
	// stays dead and a later Replay with the same filter calls BeforeMove for
	// it again, so it must be idempotent. The entry may still turn out to be
	// gone when its move runs (purged meanwhile: counted in Missing).
	BeforeMove func(ctx context.Context, e Entry) error
	// DryRun only counts what would be replayed: it takes no lease and
	// writes nothing.
	DryRun bool
	// Limit stops the replay after this many jobs; 0 means no limit. A replay
	// stopped by Limit keeps its cursor: the next Replay with the same filter
	// continues after it.
	Limit int
	// Progress, if set, is called from Replay's goroutine at most every
	// ProgressInterval, and once at the end.
	Progress func(ReplayProgress)
	// ProgressInterval defaults to [DefaultProgressInterval].
	ProgressInterval time.Duration
	// Rate bounds the replay to this many jobs per second; 0 means no
	// limit.
	Rate float64
}

// ReplayProgress reports a running replay.
type ReplayProgress struct {
	// Done is how many jobs this call has replayed.
	Done int
	// Matched is how many matching entries this call has reached, Done
	// included (and entries gone before they could be moved).
	Matched int
	// Total is how many entries matched when this call started (from its
	// cursor, if it resumed), capped by Limit.
	Total int
	// Rate is the observed rate in jobs per second.
	Rate float64
	// Elapsed is the time since the first move.
	Elapsed time.Duration
	// ETA estimates the time left.
	ETA time.Duration
}

// ReplayResult reports a finished (or stopped) replay.
type ReplayResult struct {
	// Replayed is how many jobs this call moved to the source stream (in a
	// dry run: how many it would move).
	Replayed int
	// Missing is how many matching entries were gone when their turn came
	// (purged, or moved by an earlier replay).
	Missing int
	// Skipped is how many matching entries stayed dead because they have
	// more job fields than an entry may have (stream.MaxFields: not written
	// by a consumer, which copies at most that many).
	Skipped int
	// Duplicates is how many matching entries stayed dead because another
	// job with the same idempotency key was enqueued once since (its
	// enqueue-once marker, see stream.ProducerConfig.EnqueueOnce, names
	// another job): replaying them would add the key's job twice within
	// its window. A later replay, once the marker has expired, moves them.
	Duplicates int
	// Examined is how many entries this call read.
	Examined int
	// Resumed reports that this call continued an interrupted replay from
	// its cursor.
	Resumed bool
	// Elapsed is how long the moves took.
	Elapsed time.Duration
}

// Replay moves the entries matching f, oldest first, back to the source
// stream, each atomically (see the package documentation for what a
// replayed job holds). It returns [ErrReplayActive] if another replay of
// this dead-letter stream is running, and [ErrLeaseLost] if its lease
// expires or is taken while it runs.
//
// Replay handles the entries that were in the dead-letter stream when it
// started; jobs dead-lettered later, replayed ones that die again included,
// wait for the next Replay. It is resumable: a Replay with the same filter
// after a crash, a cancellation or a Limit continues where the last one
// stopped, and reports Resumed. The cursor is kept for Config.CursorTTL.
//
// Jobs go to the DLQ's source stream, whatever their dead_stream field says.
func (d *DLQ) Replay(ctx context.Context, f Filter, o ReplayOptions) (ReplayResult, error) {
	return replay(ctx, []*DLQ{d}, f, o)
}

// replayPart is one dead-letter stream of a replay.
type replayPart struct {
	d          *DLQ
	token      string
	start, end string // the range left ("" end: nothing)
	pending    string // last examined ID not yet in the cursor
	examined   int
}

// replay is [DLQ.Replay] over the dead-letter streams of parts (one, or a
// partitioned queue's): it holds every part's lease, and moves the matching
// entries of all in one order, by entry ID (equal IDs: in the order of
// parts), so that Limit counts the moves of all. Each part keeps its own
// cursor; all are deleted when the replay reaches every part's end, and
// all kept otherwise, so a stopped replay resumes every part where it
// stopped (and a part already at its end stays there).
func replay(ctx context.Context, parts []*DLQ, f Filter, o ReplayOptions) (ReplayResult, error) {
	var res ReplayResult
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) || o.Limit < 0 || o.ProgressInterval < 0 {
		return res, fmt.Errorf("dlq: ReplayOptions: Rate (%v), Limit (%d) and ProgressInterval (%v) must not be negative",
			o.Rate, o.Limit, o.ProgressInterval)
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if _, err := f.compile(); err != nil {
		return res, err
	}
	fp := f.fingerprint()
	// count returns how many entries of p's range match, at most Limit.
	count := func(ctx context.Context, p *replayPart, examined *int) (int, error) {
		n := 0
		err := p.d.scan(ctx, f, p.start, p.end, func(_ Entry, matched bool) (bool, error) {
			if examined != nil {
				*examined++
			}
			if matched {
				n++
			}
			return o.Limit == 0 || n < o.Limit, nil
		})
		return n, err
	}
	capped := func(n int) int {
		if o.Limit > 0 {
			return min(n, o.Limit)
		}
		return n
	}

	if o.DryRun {
		for _, d := range parts {
			p := &replayPart{d: d}
			var resumed bool
			var err error
			if p.start, p.end, resumed, err = d.readCursor(ctx, fp); err != nil {
				return res, err
			}
			res.Resumed = res.Resumed || resumed
			if p.end == "" {
				continue
			}
			n, err := count(ctx, p, &res.Examined)
			res.Replayed = capped(res.Replayed + n)
			if err != nil {
				return res, err
			}
		}
		if o.Progress != nil {
			o.Progress(ReplayProgress{Matched: res.Replayed, Total: res.Replayed})
		}
		return res, nil
	}

	for _, d := range parts {
		if err := d.checkPermissions(ctx); err != nil {
			return res, err
		}
	}
	ps := make([]*replayPart, 0, len(parts))
	ctx, cancel := context.WithCancelCause(ctx)
	var renewers sync.WaitGroup
	finished := false
	defer func() {
		cancel(nil)
		renewers.Wait()
		// Release even when ctx is cancelled; a failure leaves the lease to
		// expire after LeaseTTL.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		done := "0"
		if finished {
			done = "1"
		}
		for _, p := range ps {
			_ = releaseScript.Run(rctx, p.d.rdb, []string{p.d.lease, p.d.cursor}, p.token, done).Err()
		}
	}()
	for _, d := range parts {
		token, err := d.acquire(ctx)
		if err != nil {
			return res, err
		}
		p := &replayPart{d: d, token: token}
		ps = append(ps, p)
		renewers.Go(func() { d.renew(ctx, cancel, token) })
	}
	// leaseErr turns an error caused by a renewer's cancellation into
	// ErrLeaseLost.
	leaseErr := func(err error) error {
		if c := context.Cause(ctx); errors.Is(c, ErrLeaseLost) {
			return c
		}
		return err
	}

	live := 0
	for _, p := range ps {
		var resumed bool
		var err error
		if p.start, p.end, resumed, err = p.d.readCursor(ctx, fp); err != nil {
			return res, leaseErr(err)
		}
		res.Resumed = res.Resumed || resumed
		if p.end == "" {
			continue
		}
		live++
		if !resumed {
			n, err := cursorScript.Run(ctx, p.d.rdb, []string{p.d.lease, p.d.cursor}, p.token, p.d.cfg.CursorTTL.Milliseconds(),
				"filter", fp, "end", p.end, "last", "").Int()
			if err != nil {
				return res, leaseErr(fmt.Errorf("dlq: write replay cursor: %w", err))
			}
			if n < 0 {
				return res, ErrLeaseLost
			}
		}
	}
	if live == 0 {
		finished = true
		return res, nil
	}

	total := 0
	if o.Progress != nil {
		for _, p := range ps {
			if p.end == "" {
				continue
			}
			n, err := count(ctx, p, nil)
			if err != nil {
				return res, leaseErr(err)
			}
			total = capped(total + n)
		}
	}

	pc := newPacer(o.Rate)
	t0 := time.Now()
	matched := 0
	lastReport := time.Time{}
	report := func(force bool) {
		if o.Progress == nil || (!force && time.Since(lastReport) < o.ProgressInterval) {
			return
		}
		lastReport = time.Now()
		el := time.Since(t0)
		pr := ReplayProgress{Done: res.Replayed, Matched: matched, Total: total, Elapsed: el}
		if el > 0 {
			pr.Rate = float64(res.Replayed) / el.Seconds()
		}
		if left := total - matched; left > 0 && pr.Rate > 0 {
			pr.ETA = time.Duration(float64(left) / pr.Rate * float64(time.Second))
		}
		o.Progress(pr)
	}
	m := newMerger(ctx, f, len(ps), func(i int) (*DLQ, string, string) { return ps[i].d, ps[i].start, ps[i].end })
	defer m.close()
	// Entries that do not match move the part's cursor every PageSize.
	m.skip = func(i int, e Entry) error {
		p := ps[i]
		res.Examined++
		p.examined++
		p.pending = e.ID
		if p.examined%p.d.cfg.PageSize == 0 {
			if err := p.d.advance(ctx, p.token, p.pending); err != nil {
				return err
			}
			p.pending = ""
		}
		return nil
	}
	limited := false
	err := func() error {
		for {
			i, e, err := m.peek()
			if err != nil || i < 0 {
				return err
			}
			if o.Limit > 0 && matched == o.Limit {
				limited = true // e is left for the next replay
				return nil
			}
			m.pop(i)
			p := ps[i]
			res.Examined++
			p.examined++
			if err := pc.wait(ctx); err != nil {
				return err
			}
			if o.BeforeMove != nil {
				if err := o.BeforeMove(ctx, e); err != nil {
					return fmt.Errorf("dlq: before replaying %s: %w", e.ID, err)
				}
			}
			d := p.d
			keys := []string{d.dead, d.source, d.lease, d.cursor}
			if key, ok := e.Value(stream.FieldIdempotencyKey); ok && key != "" {
				marker, err := stream.OnceKey(d.source, key)
				if err != nil {
					return err
				}
				keys = append(keys, marker)
			}
			v, err := d.move(ctx, keys, p.token, &e)
			if err != nil {
				return fmt.Errorf("dlq: replay %s: %w", e.ID, err)
			}
			p.pending = ""
			matched++
			switch v := v.(type) {
			case string:
				res.Replayed++
			case int64:
				switch v {
				case -1:
					return ErrLeaseLost
				case -2:
					res.Skipped++
				case -3:
					res.Duplicates++
				default:
					res.Missing++
				}
			}
			report(false)
		}
	}()
	for _, p := range ps {
		if err == nil && p.pending != "" {
			err = p.d.advance(ctx, p.token, p.pending)
		}
	}
	res.Elapsed = time.Since(t0)
	report(true)
	if err != nil {
		return res, leaseErr(err)
	}
	finished = !limited
	return res, nil
}

// move runs move.lua for entry e with keys (a marker at keys[4], if
// any), adding the index record of a tracked job: the one its fields name
// as the script derives it (job_id, else the source entry ID, else the
// dead-letter entry's), or, when the script names another, that one in a
// second call.
func (d *DLQ) move(ctx context.Context, keys []string, token string, e *Entry) (any, error) {
	ttl := d.cfg.CursorTTL.Milliseconds()
	over := "0" // the entry decoded with more fields than stream.MaxFields: it stays dead
	if de, ok := e.DecodeErr.(*stream.DecodeError); ok && de.Fields > 0 {
		over = "1"
	}
	if v, _ := e.Value(stream.FieldTrack); v != "1" {
		return moveScript.Run(ctx, d.rdb, keys, token, e.ID, ttl, 0, over).Result()
	}
	sk, err := stream.KeysFor(d.source)
	if err != nil {
		return nil, err
	}
	id, _ := e.Value(stream.FieldJobID)
	if id == "" {
		id = e.ID
		if src, _ := e.Value(FieldDeadEntryID); validID(src) {
			id = src
		}
	}
	record := stream.JobKey(sk, id)
	for range 2 {
		v, err := moveScript.Run(ctx, d.rdb, append(slices.Clip(keys), record), token, e.ID, ttl, len(keys)+1, over).Result()
		want, ok := v.([]any)
		if err != nil || !ok {
			return v, err
		}
		if len(want) != 1 {
			break
		}
		if record, ok = want[0].(string); !ok || !strings.HasPrefix(record, sk.Job) {
			break
		}
	}
	return nil, errors.New("the move script asked for an index record outside the queue, or again")
}

// readCursor returns the range a replay with filter fingerprint fp covers:
// after the cursor's last ID up to its end when the cursor was written with
// the same filter (resumed), otherwise the whole stream up to its newest
// entry. end is "" when there is nothing to replay.
func (d *DLQ) readCursor(ctx context.Context, fp string) (start, end string, resumed bool, err error) {
	c, err := d.rdb.HGetAll(ctx, d.cursor).Result()
	if err != nil {
		return "", "", false, fmt.Errorf("dlq: read replay cursor: %w", err)
	}
	if c["filter"] == fp && c["end"] != "" {
		start = "-"
		if c["last"] != "" {
			start = "(" + c["last"]
		}
		return start, c["end"], true, nil
	}
	end, err = d.lastID(ctx)
	if err != nil {
		return "", "", false, fmt.Errorf("dlq: XREVRANGE %s: %w", d.dead, err)
	}
	return "-", end, false, nil
}

// advance moves the cursor past entries that did not match.
func (d *DLQ) advance(ctx context.Context, token, last string) error {
	n, err := cursorScript.Run(ctx, d.rdb, []string{d.lease, d.cursor}, token, d.cfg.CursorTTL.Milliseconds(), "last", last).Int()
	if err != nil {
		return fmt.Errorf("dlq: write replay cursor: %w", err)
	}
	if n < 0 {
		return ErrLeaseLost
	}
	return nil
}

// checkPermissions fails a replay before it takes its lease when the Redis
// user may not send one of its commands. A move's XDEL comes after its XADD,
// and a script keeps the writes made before a denied command: without XDEL,
// each moved job would stay dead too, to be replayed again by the next
// Replay. Servers that cannot tell (Redis 6, miniredis) are not checked.
func (d *DLQ) checkPermissions(ctx context.Context) error {
	need := func(use, key string, args ...string) perm.Need {
		return perm.Need{Args: args, Key: key, Use: use}
	}
	needs := []perm.Need{
		need("the replay lease", d.lease, "SET", d.lease, "t", "NX", "PX", "1"),
		need("the replay lease", d.lease, "GET", d.lease),
		need("the replay lease", d.lease, "PEXPIRE", d.lease, "1"),
		need("the replay lease", d.lease, "DEL", d.lease),
		need("the replay cursor", d.cursor, "HGETALL", d.cursor),
		need("the replay cursor", d.cursor, "HSET", d.cursor, "f", "v"),
		need("the replay cursor", d.cursor, "PEXPIRE", d.cursor, "1"),
		need("the replay cursor", d.cursor, "DEL", d.cursor),
		need("reading dead letters", d.dead, "XRANGE", d.dead, "-", "+", "COUNT", "1"),
		need("reading dead letters", d.dead, "XREVRANGE", d.dead, "+", "-", "COUNT", "1"),
		need("moving jobs back", d.source, "XADD", d.source, "*", "f", "v"),
		need("moving jobs back", d.dead, "XDEL", d.dead, "0-1"),
		need("scripts", d.dead, "EVALSHA", "0000000000000000000000000000000000000000", "4", d.dead, d.source, d.lease, d.cursor),
		need("scripts", d.dead, "EVAL", "return 0", "4", d.dead, d.source, d.lease, d.cursor),
	}
	denied, checked, err := perm.Check(ctx, d.rdb, d.dead, needs)
	switch {
	case err != nil:
		return fmt.Errorf("dlq: check the Redis user's permissions (a replay runs scripts on %s): %w", d.dead, err)
	case checked && len(denied) > 0:
		return fmt.Errorf("dlq: the Redis user may not send commands a replay needs (see docs/acl.md): %s", perm.Describe(denied))
	}
	return nil
}

// acquire takes the replay lease and returns its token.
func (d *DLQ) acquire(ctx context.Context) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	ok, err := d.rdb.SetNX(ctx, d.lease, token, d.cfg.LeaseTTL).Result()
	if err != nil {
		return "", fmt.Errorf("dlq: take replay lease %s: %w", d.lease, err)
	}
	if !ok {
		return "", fmt.Errorf("%w (lease %s)", ErrReplayActive, d.lease)
	}
	return token, nil
}

// renew extends the lease every LeaseTTL/3 until ctx ends, and cancels ctx
// with ErrLeaseLost when the lease is no longer ours or has not been renewed
// within LeaseTTL.
func (d *DLQ) renew(ctx context.Context, cancel context.CancelCauseFunc, token string) {
	every := d.cfg.LeaseTTL / 3
	t := time.NewTicker(every)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, every)
		n, err := renewScript.Run(rctx, d.rdb, []string{d.lease}, token, d.cfg.LeaseTTL.Milliseconds()).Int()
		rcancel()
		switch {
		case err == nil && n == 1:
			renewed = time.Now()
		case err == nil:
			cancel(ErrLeaseLost)
			return
		case time.Since(renewed) >= d.cfg.LeaseTTL:
			cancel(fmt.Errorf("%w: not renewed for %v: %v", ErrLeaseLost, d.cfg.LeaseTTL, err))
			return
		}
	}
}

// pacer spaces moves by a schedule: the n-th starts no earlier than
// start + n/rate. After a stall it does not burst to catch up by more than
// burst.
type pacer struct {
	interval time.Duration
	next     time.Time
}

const pacerBurst = 100 * time.Millisecond

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / rate)}
}

func (p *pacer) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if p.interval == 0 {
		return nil
	}
	now := time.Now()
	switch {
	case p.next.IsZero() || now.Sub(p.next) > pacerBurst:
		p.next = now
	case p.next.After(now):
		t := time.NewTimer(p.next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	p.next = p.next.Add(p.interval)
	return nil
}

// validID reports whether s is digits, '-', digits, as move.lua takes a
// dead_entry_id.
func validID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	digits := func(x string) bool {
		return x != "" && strings.Trim(x, "0123456789") == ""
	}
	return ok && digits(ms) && digits(seq)
}
