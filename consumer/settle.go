package consumer

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed ack.lua
	ackLua string
	//go:embed retry.lua
	retryLua string
	//go:embed dead.lua
	deadLua string

	//go:embed ids.lua
	idsLua string

	// The settlement scripts use the helpers of ids.lua, put in front.
	ackScript   = redis.NewScript(idsLua + ackLua)
	retryScript = redis.NewScript(idsLua + retryLua)
	deadScript  = redis.NewScript(idsLua + deadLua)
)

// maxAckBatch is the most entry IDs one ack script acknowledges.
const maxAckBatch = 512

// maxErrorHistory is how many of its latest errors a retried job carries.
const maxErrorHistory = 5

// maxErrorBytes bounds the error text stored with a retried or dead job.
const maxErrorBytes = 4096

// settleContext returns the context a settlement runs under: not cancelled
// with the job or the consumer, bounded by SettleTimeout.
func (c *Consumer) settleContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.base, c.r.SettleTimeout)
}

// ackItem is an entry for the ack loop: a finished job to acknowledge, or
// (forget) an entry already settled by another script, to delete from the
// stream once no group needs it.
type ackItem struct {
	id     string
	forget bool
	// index is the index record of a tracked job ("" for none), and
	// result what its handler recorded (SetResult).
	index, result string
	// cancelled: the job was cancelled (KindCancelled); its record says
	// cancelled, not done.
	cancelled bool
}

// queueAck hands a finished job (or an entry to forget) to the ack loop,
// and reports whether it did (not once Run has returned: the job then stays
// pending). It wakes the ack loop only when the loop waits for as many
// items as are now queued (see fillAcks).
func (c *Consumer) queueAck(it ackItem) bool {
	select {
	case c.ackCh <- it:
	case <-c.ackDone:
		return false
	}
	if want := c.ackWant.Load(); want > 0 && int64(len(c.ackCh)) >= want {
		select {
		case c.ackKick <- struct{}{}:
		default:
		}
	}
	return true
}

// forgetSettled asks the ack loop to delete entry id, which this consumer
// has settled with another script, unless Config.KeepSettled.
func (c *Consumer) forgetSettled(id string) {
	if !c.r.KeepSettled {
		c.queueAck(ackItem{id: id, forget: true})
	}
}

// The ack loop's batching. A batch waits up to ackLinger for more finished
// jobs while it holds fewer than half of the jobs in flight (running,
// queued or waiting for this batch), so that a consumer whose jobs finish
// together sends one script for many of them instead of one per few, and
// an idle one acknowledges within ackLinger. The trim of settled entries
// (the second half of ack.lua: XINFO GROUPS, an XPENDING per group, XTRIM
// MINID, XLEN) runs once ackTrimEvery entries have been settled since the
// last one, when the batch settles the last jobs in flight and the last
// read found the stream caught up, or ackTrimAfter after the first of
// fewer; this is the one place that decides it. Trimming removes whole
// stream nodes of about 100 entries, so trimming at every small batch cost
// Redis CPU and removed nothing more. The price: each consumer leaves up to
// ackTrimEvery settled entries (or ackTrimAfter's worth) in the stream
// between its trims, and while the horizon is held back (ack.lua) that many
// more than the 1000 settled entries the script lets pile up above it
// (a larger ackTrimEvery, 500, was measured; see the branch's notes: it
// broke README's "about 1,000" bound for too little Redis CPU).
// ackTrimEvery stays under maxAckBatch, so that the candidates for deletion
// of one trim interval all fit in one script.
const (
	ackLinger    = time.Millisecond
	ackTrimEvery = 100
	ackTrimAfter = 100 * time.Millisecond
)

// ackLoop acknowledges finished jobs in batches (see ackLinger), and trims
// the entries settled (see ackTrimEvery).
func (c *Consumer) ackLoop(stop <-chan struct{}) {
	defer close(c.ackDone)
	batch := make([]ackItem, 0, maxAckBatch)
	// settled: entries acknowledged or settled by another script since the
	// last trim; the trim's candidates for deletion (see ack.lua).
	var settled []string
	trimDue := time.NewTimer(time.Hour)
	trimDue.Stop()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	flush := func(trim bool) {
		had := len(settled) > 0
		acks := 0
		for _, it := range batch {
			if !it.forget {
				acks++
			}
		}
		c.mu.Lock()
		// Nothing else to settle, nothing more to read: trim now.
		idle := len(c.inflight) <= acks && c.caughtUp.Load()
		c.mu.Unlock()
		trim = trim || idle || len(settled)+len(batch) >= ackTrimEvery
		settled = c.flushAcks(batch, settled, trim)
		batch = batch[:0]
		if n := len(settled); n > maxAckBatch {
			// Trims keep failing: the oldest candidates are left to the
			// MINID trim, so that one script's arguments stay bounded.
			settled = settled[:copy(settled, settled[n-maxAckBatch:])]
		}
		switch {
		case len(settled) == 0:
			trimDue.Stop()
		case !had || trim: // new candidates, or a trim that failed: try again
			trimDue.Reset(ackTrimAfter)
		}
	}
	for {
		select {
		case it := <-c.ackCh:
			batch = append(batch, it)
		case <-trimDue.C:
			flush(true)
			continue
		case <-stop:
			for {
				select {
				case it := <-c.ackCh:
					batch = append(batch, it)
					if len(batch) == maxAckBatch {
						flush(false)
					}
				default:
					flush(true)
					return
				}
			}
		}
		c.fillAcks(&batch, linger, stop)
		flush(false)
	}
}

// fillAcks adds to batch what the ack loop has queued, then waits for more
// while batch holds fewer than half of the jobs in flight, for at most
// ackLinger. It sleeps until enough are queued (queueAck wakes it), not
// until each one is.
func (c *Consumer) fillAcks(batch *[]ackItem, linger *time.Timer, stop <-chan struct{}) {
	lingering := false
	defer func() {
		c.ackWant.Store(0)
		if lingering {
			linger.Stop()
		}
	}()
	for len(*batch) < maxAckBatch {
		select {
		case it := <-c.ackCh:
			*batch = append(*batch, it)
			continue
		default:
		}
		c.mu.Lock()
		want := min((len(c.inflight)+1)/2, maxAckBatch)
		c.mu.Unlock()
		if len(*batch) >= want {
			return
		}
		// Published before looking again, so that a job queued after that
		// look wakes the loop. No more than the queue holds: a full queue
		// wakes it.
		c.ackWant.Store(int64(min(want-len(*batch), cap(c.ackCh))))
		if len(c.ackCh) > 0 {
			continue
		}
		if !lingering {
			lingering = true
			linger.Reset(ackLinger)
		}
		select {
		case <-c.ackKick:
		case <-linger.C:
			lingering = false
			*batch = appendQueued(*batch, c.ackCh)
			return
		case <-stop:
			return
		}
	}
}

// appendQueued appends to batch, up to maxAckBatch, the items queued in ch.
func appendQueued(batch []ackItem, ch chan ackItem) []ackItem {
	for len(batch) < maxAckBatch {
		select {
		case it := <-ch:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}

// flushAcks runs the owner-checked ack script over items, retrying
// transient errors until SettleTimeout. Jobs it cannot acknowledge stay
// pending. A job whose entry is no longer pending when the script runs
// again after an error was acknowledged by the first run, whose reply was
// lost. With trim (and not Config.KeepSettled) the script also trims the
// stream, with settled, entries settled since the last trim, as candidates
// for deletion; it returns the candidates for the next trim: settled and
// the entries items settled, or none once trimmed.
func (c *Consumer) flushAcks(items []ackItem, settled []string, trim bool) []string {
	trim = trim && !c.r.KeepSettled
	if len(items) == 0 && (!trim || len(settled) == 0) {
		return settled
	}
	ids := make([]string, 0, len(items))
	forget := settled
	keys, tracked := []string{c.r.Stream}, []any(nil)
	var cancelled []string
	for _, it := range items {
		if it.forget {
			forget = append(forget, it.id)
		} else {
			ids = append(ids, it.id)
			if it.index != "" {
				state := stream.StateDone
				if it.cancelled {
					state = stream.StateCancelled
					cancelled = append(cancelled, it.id)
				}
				keys = append(keys, it.index)
				tracked = append(tracked, it.id, state, it.result)
			}
		}
	}
	if len(ids) == 0 && !trim {
		return forget // nothing to acknowledge: the candidates wait for the trim
	}
	// The script compares no IDs: it gets them sorted, each once, with the
	// lowest and the highest.
	stream.SortIDs(ids)
	ids = slices.Compact(ids)
	lo, hi := "", ""
	if len(ids) > 0 {
		lo, hi = ids[0], ids[len(ids)-1]
	}
	// The candidates for deletion go to Redis only when the last trim found
	// settled entries piled up (ack.lua): otherwise the MINID trim removes
	// them and sending them would cost Redis CPU for nothing.
	send := trim && c.ackPiled.Load()
	defer func() {
		c.mu.Lock()
		for _, id := range ids {
			delete(c.inflight, id)
		}
		c.mu.Unlock()
	}()
	del := "0"
	if trim {
		del = "1"
	}
	args := make([]any, 0, 8+len(tracked)+len(ids)+len(forget))
	args = append(args, c.r.Group, c.r.Consumer, del, len(ids), len(keys)-1, c.r.TrackTTL.Milliseconds(), lo, hi)
	args = append(args, tracked...)
	// Pointers into ids and forget, which go-redis writes as the strings
	// they point to: boxing each string in an interface would cost an
	// allocation per job.
	for i := range ids {
		args = append(args, &ids[i])
	}
	if send {
		for i := range forget {
			args = append(args, &forget[i])
		}
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	var b backoff
	for try := 0; ; try++ {
		res, err := ackScript.Run(ctx, c.rdb, keys, args...).Slice()
		if err == nil && len(res) == 5 {
			stale, gone := replyStrings(res[1]), replyStrings(res[2])
			if try > 0 {
				// Not pending any more: the earlier run acknowledged them.
				gone = nil
			}
			n := len(cancelled)
			for _, id := range cancelled {
				if slices.Contains(stale, id) || slices.Contains(gone, id) {
					n--
				}
			}
			c.stats.cancelled.Add(uint64(n))
			c.stats.acked.Add(uint64(len(ids) - len(stale) - len(gone) - n))
			for _, id := range stale {
				c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "finished job is owned by another consumer now (it was reclaimed and runs again there); not acknowledged here",
					c.entryAttrs(id, errKindLeaseLost, "")...)
			}
			for _, id := range gone {
				c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "finished job was already acknowledged (another consumer reclaimed and finished it) or deleted; not acknowledged here",
					c.entryAttrs(id, errKindLeaseLost, "")...)
			}
			c.stats.stale.Add(uint64(len(stale) + len(gone)))
			// Checked once per batch, so that a logger without Debug costs
			// nothing per job.
			if c.r.Logger.Enabled(c.base, slog.LevelDebug) {
				c.logDone(ids, append(stale, gone...))
			}
			if c.r.KeepSettled {
				return forget[:0]
			}
			if trim {
				piled, _ := res[4].(int64)
				c.ackPiled.Store(piled == 1)
				if piled == 1 && !send {
					// Piled up, and this trim had not sent them: the next will.
					return forget
				}
				return forget[:0]
			}
			// What this consumer acknowledged waits for the next trim; an
			// entry another consumer owns now is not settled.
			for _, id := range ids {
				if !slices.Contains(stale, id) {
					forget = append(forget, id)
				}
			}
			return forget
		}
		if err == nil {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		if !b.wait(ctx) {
			c.errLog.error("acknowledging finished jobs failed; they stay pending and will run again", err,
				"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "count", len(ids))
			if c.r.KeepSettled {
				return forget[:0]
			}
			return forget
		}
	}
}

// replyStrings returns the strings of a script's array reply.
func replyStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// logDone logs "job done" at Debug for each of ids but the stale ones.
func (c *Consumer) logDone(ids []string, stale []string) {
	for _, id := range ids {
		if !slices.Contains(stale, id) {
			c.r.Logger.LogAttrs(c.base, slog.LevelDebug, "job done", c.entryAttrs(id, "", "")...)
		}
	}
}

// cutShortBytes is how much of each field name and value the dead letter
// of an oversize entry keeps.
const cutShortBytes = stream.CutBytes

// cutShort returns fields (names and values, as in an entry) with each
// name and value cut to cutShortBytes, in the same order.
func cutShort(fields []string) []string {
	out := make([]string, len(fields))
	for i, s := range fields {
		if len(s) > cutShortBytes {
			s = s[:cutShortBytes]
		}
		out[i] = s
	}
	return out
}

// appendFields appends fields (names and values, as in an entry) to args,
// in their order.
func appendFields(args []any, fields []string) []any {
	for _, s := range fields {
		args = append(args, s)
	}
	return args
}

// withError returns a failed job's last_error and error_history with msg,
// its latest error, added: truncated, the latest maxErrorHistory kept.
func withError(job *stream.Job, msg string) (string, []string) {
	last := truncate(msg)
	history := append(slices.Clone(job.ErrorHistory), last)
	if n := len(history); n > maxErrorHistory {
		history = history[n-maxErrorHistory:]
	}
	return last, history
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// maxLoggedValue bounds each value a producer controls in a log record.
const maxLoggedValue = 256

// BoundLogValue cuts s, a value a producer chose (a job's type, ID,
// idempotency or lock key), to the 256 bytes Pelican puts in a log record,
// so that a 1 MB type cannot make a 1 MB log line. Middleware that logs such
// values uses it too.
func BoundLogValue(s string) string { return clip(s) }

// clip bounds s, a value a producer chose, for a log record.
func clip(s string) string {
	if len(s) > maxLoggedValue {
		return s[:maxLoggedValue] + "...(truncated)"
	}
	return s
}

// errorText is the text of a job's error as Pelican stores and logs it:
// Config.RedactError's, bounded to maxErrorBytes. job is nil for an entry
// that did not decode.
func (c *Consumer) errorText(job *stream.Job, text string) string {
	if c.r.RedactError != nil {
		text = c.r.RedactError(job, text)
	}
	return truncate(text)
}

func truncate(s string) string {
	if len(s) > maxErrorBytes {
		return s[:maxErrorBytes] + "...(truncated)"
	}
	return s
}

// Values of the error_kind attribute of log records about a job, besides
// "" (none) and the dead-letter reasons (see [Config.Logger]).
const (
	errKindRetryable = "retryable"
	errKindSnooze    = "snooze"
	errKindTimeout   = "timeout"
	errKindShutdown  = "shutdown"
	errKindLeaseLost = "lease_lost"
	errKindLost      = "lost"
	errKindCancelled = "cancelled"
)

// deadKind returns the error_kind of a job dead-lettered with reason: the
// reason when it is one of the consumer's, else (a reason a handler gave to
// [Dead]) "permanent", so that error_kind stays a closed set; the record's
// dead_reason attribute has the reason itself.
func deadKind(reason string) string {
	switch reason {
	case ReasonMalformed, ReasonUnknownType, ReasonCrashed, ReasonPanic, ReasonExhausted, ReasonPermanent:
		return reason
	}
	return ReasonPermanent
}

// jobAttrs returns the attributes of a log record about one job: always the
// same keys, in the same order, with "" or 0 where a value is unknown (job
// is nil for an entry that did not decode), then "error" when msg is not
// empty. ran is how long the handler ran. It never includes the payload or
// the entry's raw fields.
func (c *Consumer) jobAttrs(entryID string, job *stream.Job, ran time.Duration, kind, msg string) []slog.Attr {
	var id, typ, idem, lock, trace string
	var attempt int
	if job != nil {
		// A producer chose these: bounded, so that a 1 MB type cannot make
		// a 1 MB log line.
		id, typ, idem, lock, attempt = clip(job.ID), clip(job.Type), clip(job.IdempotencyKey), clip(job.LockKey), job.Attempt
		trace = traceID(job.TraceParent)
	}
	attrs := make([]slog.Attr, 0, 16) // room for a record's own attributes
	attrs = append(attrs,
		slog.String("stream", c.r.Stream),
		slog.String("group", c.r.Group),
		slog.String("consumer", c.r.Consumer),
		slog.String("entry_id", entryID),
		slog.String("job_id", id),
		slog.String("job_type", typ),
		slog.String("idempotency_key", idem),
		slog.Int("attempt", attempt),
		slog.String("lock_key", lock),
		slog.String("trace_id", trace),
		slog.Int64("duration_ms", ran.Milliseconds()),
		slog.String("error_kind", kind),
	)
	if msg != "" {
		attrs = append(attrs, slog.String("error", c.errorText(job, msg)))
	}
	return attrs
}

// entryAttrs returns [Consumer.jobAttrs] for entry id, with the job and the
// handler's run time of the task running it, if any.
func (c *Consumer) entryAttrs(id, kind, msg string) []slog.Attr {
	var job *stream.Job
	var ran time.Duration
	c.mu.Lock()
	if t := c.inflight[id]; t != nil {
		job, ran = t.job, t.handlerTime()
	}
	c.mu.Unlock()
	return c.jobAttrs(id, job, ran, kind, msg)
}

// anys converts attrs for a function taking slog's ...any arguments.
func anys(attrs []slog.Attr) []any {
	out := make([]any, len(attrs))
	for i, a := range attrs {
		out[i] = a
	}
	return out
}

// traceID returns the trace ID of a W3C traceparent header,
// "<version>-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", or "" when
// the header is not well formed. It does not allocate.
func traceID(tp string) string {
	const n = 55 // length of a version 00 header
	switch {
	case len(tp) < n,
		len(tp) > n && (tp[:2] == "00" || tp[n] != '-'), // later versions may append fields
		tp[2] != '-' || tp[35] != '-' || tp[52] != '-',
		!isLowerHex(tp[:2]) || tp[:2] == "ff",
		!isLowerHex(tp[3:35]) || !isLowerHex(tp[36:52]) || !isLowerHex(tp[53:55]),
		tp[3:35] == "00000000000000000000000000000000",
		tp[36:52] == "0000000000000000":
		return ""
	}
	return tp[3:35]
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
