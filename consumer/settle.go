package consumer

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
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

	ackScript   = redis.NewScript(ackLua)
	retryScript = redis.NewScript(retryLua)
	deadScript  = redis.NewScript(deadLua)
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

// queueAck hands a finished job to the ack loop, and reports whether it did
// (not once Run has returned: the job then stays pending).
func (c *Consumer) queueAck(id string) bool {
	select {
	case c.ackCh <- id:
		return true
	case <-c.ackDone:
		return false
	}
}

// ackLoop acknowledges finished jobs in batches: it takes what is queued at
// each turn, so a busy consumer sends one script per many jobs and an idle
// one acknowledges at once.
func (c *Consumer) ackLoop(stop <-chan struct{}) {
	defer close(c.ackDone)
	batch := make([]string, 0, maxAckBatch)
	for {
		select {
		case id := <-c.ackCh:
			batch = append(batch, id)
		case <-stop:
			for {
				select {
				case id := <-c.ackCh:
					batch = append(batch, id)
					if len(batch) == maxAckBatch {
						c.flushAcks(batch)
						batch = batch[:0]
					}
				default:
					c.flushAcks(batch)
					return
				}
			}
		}
	fill:
		for len(batch) < maxAckBatch {
			select {
			case id := <-c.ackCh:
				batch = append(batch, id)
			default:
				break fill
			}
		}
		c.flushAcks(batch)
		batch = batch[:0]
	}
}

// flushAcks runs the owner-checked ack script over ids, retrying transient
// errors until SettleTimeout. Jobs it cannot acknowledge stay pending.
func (c *Consumer) flushAcks(ids []string) {
	if len(ids) == 0 {
		return
	}
	defer func() {
		c.mu.Lock()
		for _, id := range ids {
			delete(c.inflight, id)
		}
		c.mu.Unlock()
	}()
	lo, hi := ids[0], ids[0]
	for _, id := range ids[1:] {
		if compareIDs(id, lo) < 0 {
			lo = id
		} else if compareIDs(id, hi) > 0 {
			hi = id
		}
	}
	args := make([]any, 0, 4+len(ids))
	args = append(args, c.r.Group, c.r.Consumer, lo, hi)
	for _, id := range ids {
		args = append(args, id)
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	var b backoff
	for {
		res, err := ackScript.Run(ctx, c.rdb, []string{c.r.Stream}, args...).Slice()
		if err == nil {
			c.stats.acked.Add(uint64(len(ids) - (len(res) - 1)))
			if stale := res[1:]; len(stale) > 0 {
				c.stats.stale.Add(uint64(len(stale)))
				c.r.Logger.Warn("finished jobs were no longer owned by this consumer (reclaimed or already acknowledged); not acknowledged here",
					"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "entry_ids", stale)
			}
			return
		}
		if !b.wait(ctx) {
			c.errLog.error("acknowledging finished jobs failed; they stay pending and will run again", err,
				"stream", c.r.Stream, "group", c.r.Group, "count", len(ids))
			return
		}
	}
}

// settleError settles a job whose handler returned err.
func (c *Consumer) settleError(ctx context.Context, job *stream.Job, d delivery, err error) {
	var (
		o  *Outcome
		p  *PanicError
		ce *ClassifiedError
	)
	switch {
	case errors.As(err, &o) && o.IsDead():
		c.settleDead(ctx, d.id, d.fields, o.Reason(), errText(o.Unwrap()), job.Attempt+1, job)
	case errors.As(err, &o):
		c.settleRetry(ctx, job, d, o.Delay(), o.CountsAttempt(), o.Unwrap())
	case errors.As(err, &p):
		c.settleDead(ctx, d.id, d.fields, ReasonPanic, err.Error(), job.Attempt+1, job)
	case errors.As(err, &ce) && ce.Permanent, errors.Is(err, stream.ErrPayload):
		c.settleDead(ctx, d.id, d.fields, ReasonPermanent, err.Error(), job.Attempt+1, job)
	case errors.As(err, &ce) && ce.After > 0:
		c.settleRetry(ctx, job, d, ce.After, true, err)
	default:
		c.settleRetry(ctx, job, d, backoffDelay, true, err)
	}
}

// backoffDelay asks settleRetry for Config.RetryBackoff's delay, computed
// only when the job has an attempt left.
const backoffDelay time.Duration = -1

// settleRetry schedules the job's next attempt after delay, or
// dead-letters it when the attempt would exceed its maximum.
func (c *Consumer) settleRetry(jobCtx context.Context, job *stream.Job, d delivery, delay time.Duration, count bool, err error) {
	next := *job
	if count {
		next.Attempt++
		maxAttempts := job.MaxAttempts
		if maxAttempts == 0 {
			maxAttempts = c.r.MaxAttempts
		}
		if next.Attempt >= maxAttempts {
			c.settleDead(jobCtx, d.id, d.fields, ReasonExhausted, errText(err), next.Attempt, job)
			return
		}
		next.LastError = truncate(errText(err))
		next.ErrorHistory = append(slices.Clone(job.ErrorHistory), next.LastError)
		if n := len(next.ErrorHistory); n > maxErrorHistory {
			next.ErrorHistory = next.ErrorHistory[n-maxErrorHistory:]
		}
		if next.FirstFailedAt.IsZero() {
			next.FirstFailedAt = time.Now()
		}
	}
	if delay == backoffDelay {
		delay = c.r.RetryBackoff(job.Attempt)
	}
	fields := stream.Encode(&next)
	// retry.lua compares the delay in ms: a positive delay under 1 ms is no
	// delay, and must come with the fields of the entry to add at once.
	args := []any{c.r.Group, c.r.Consumer, d.id, delay.Milliseconds()}
	if delay.Milliseconds() > 0 {
		args = append(args, stream.EncodeDelayed(d.id, fields))
	} else {
		args = append(args, "")
		args = append(args, fields...)
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	res, serr := retryScript.Run(ctx, c.rdb, []string{c.r.Stream, c.r.keys.Delayed}, args...).Result()
	switch {
	case serr != nil:
		c.errLog.error("scheduling a retry failed; the job stays pending and will run again", serr, jobAttrs(job, err)...)
	case res == int64(-1):
		c.stats.stale.Add(1)
		c.r.Logger.Warn("failed job was no longer owned by this consumer; not rescheduled here", jobAttrs(job, err)...)
	default:
		c.stats.retried.Add(1)
		c.r.Logger.Warn("job failed; retry scheduled", append(jobAttrs(job, err), "delay_ms", delay.Milliseconds(), "counts_attempt", count)...)
	}
}

// settleDead dead-letters entry id. job is nil for an entry that did not
// decode. jobCtx carries the dead-letter recorder a middleware may have set.
func (c *Consumer) settleDead(jobCtx context.Context, id string, fields map[string]any, reason, msg string, attempts int, job *stream.Job) {
	info := DeadLetter{Job: job, EntryID: id, Stream: c.r.Stream, DeadLetterStream: c.r.DeadLetterStream,
		Reason: reason, Error: msg, Attempts: attempts}
	rec := recorderOf(jobCtx)
	var replace map[string]string
	if rec != nil {
		replace = rec.Replace(info)
	}
	args := make([]any, 0, 8+2*len(replace)+2*len(fields))
	args = append(args, c.r.Group, c.r.Consumer, id, reason, truncate(msg), attempts, c.r.DeadLetterMaxLen, 2*len(replace))
	for k, v := range replace {
		args = append(args, k, v)
	}
	for k, v := range fields {
		args = append(args, k, v)
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	res, err := deadScript.Run(ctx, c.rdb, []string{c.r.Stream, c.r.DeadLetterStream}, args...).Result()
	attrs := []any{"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer, "entry_id", id, "dead_reason", reason, "error", msg}
	if job != nil {
		attrs = append(attrs, "job_id", job.ID, "job_type", job.Type, "attempt", job.Attempt)
	}
	if err != nil {
		c.errLog.error("dead-lettering failed; the job stays pending and will be delivered again", err, attrs...)
		return
	}
	reply, _ := res.([]any)
	if len(reply) != 2 {
		c.stats.stale.Add(1)
		c.r.Logger.Warn("job to dead-letter was no longer owned by this consumer; not dead-lettered here", attrs...)
		return
	}
	info.DeadEntryID, _ = reply[0].(string)
	c.stats.dead.Add(1)
	c.r.Logger.Error("job dead-lettered", append(attrs, "dead_letter_stream", c.r.DeadLetterStream, "dead_entry_id", info.DeadEntryID)...)
	if trimmed, _ := reply[1].(int64); trimmed > 0 {
		c.stats.deadTrimmed.Add(uint64(trimmed))
		c.r.Logger.Warn("the dead-letter stream is over Config.DeadLetterMaxLen: its oldest entries were removed",
			"dead_letter_stream", c.r.DeadLetterStream, "removed", trimmed, "max_len", c.r.DeadLetterMaxLen)
	}
	if rec != nil {
		rec.Recorded(jobCtx, info)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func truncate(s string) string {
	if len(s) > maxErrorBytes {
		return s[:maxErrorBytes] + "...(truncated)"
	}
	return s
}

// compareIDs orders stream entry IDs ("<ms>-<seq>") numerically.
func compareIDs(a, b string) int {
	am, as := splitID(a)
	bm, bs := splitID(b)
	switch {
	case am != bm:
		return cmp.Compare(am, bm)
	default:
		return cmp.Compare(as, bs)
	}
}

// splitID parses "<ms>-<seq>"; malformed parts read as 0.
func splitID(id string) (ms, seq uint64) {
	cur := &ms
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c == '-' {
			cur = &seq
			continue
		}
		*cur = *cur*10 + uint64(c-'0')
	}
	return ms, seq
}

func jobAttrs(job *stream.Job, err error) []any {
	attrs := []any{"stream", job.Stream, "entry_id", job.EntryID, "job_id", job.ID, "job_type", job.Type, "attempt", job.Attempt}
	if job.IdempotencyKey != "" {
		attrs = append(attrs, "idempotency_key", job.IdempotencyKey)
	}
	if job.LockKey != "" {
		attrs = append(attrs, "lock_key", job.LockKey)
	}
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	return attrs
}
