package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// Rescheduling: jobs whose attempt failed (or that snoozed) are rescheduled
// in batches, one retry script for all the jobs queued meanwhile (up to
// retryScripts batches at once), as
// acknowledgements are (see ackLoop). A worker does not wait for Redis: it
// queues the job and takes its next one; the retry loop runs the script,
// then logs and counts each job's outcome. The job stays in the in-flight
// set until then, so that this consumer's own sweep cannot start it again
// in between, and shutdown runs what is queued before the ack loop stops.
// A suspect waits for its batch (it settles before the next one starts).

// maxRetryBatch bounds the jobs one retry script reschedules, and
// maxRetryBatchBytes the bytes of their fields (a batch takes at least one
// job, whatever its size).
const (
	maxRetryBatch      = 64
	maxRetryBatchBytes = 1 << 20
)

// retryReq is one job to reschedule: its retry.lua values, and what the
// retry loop logs once the script has run.
type retryReq struct {
	// args are the job's values for retry.lua without the index and error
	// (entry ID, delay, member, n, values); index and err are the job's
	// index record ("" when untracked) and the error to record.
	args       []any
	index, err string
	size       int
	// id is the entry; job, ran (the handler's run time), kind (the
	// error_kind), msg (the handler's error), delay and count (an attempt
	// counted: a retry, not a snooze) are for the log record.
	id    string
	job   *stream.Job
	ran   time.Duration
	kind  string
	msg   string
	delay time.Duration
	count bool
	// done, when not nil, receives the outcome: the caller waits for it.
	done chan bool
	// room: the job's place in the workers' queue, freed once settled.
	room bool
	// dead, when not nil, makes this a dead letter (dead.lua), not a retry.
	dead *deadReq
}

// retryScripts is how many retry batches run at once. A queued retry keeps
// its job's place in the workers' queue until its batch has run, so the
// read loop waits for the batches: with two, the next batch fills and goes
// out while the last one is in Redis, instead of after it.
const retryScripts = 2

// retryLoop runs the batches until stop is closed and nothing is queued,
// then waits for those still running.
func (c *Consumer) retryLoop(stop <-chan struct{}) {
	defer close(c.retryDone)
	var running sync.WaitGroup
	defer running.Wait()
	slots := make(chan struct{}, retryScripts)
	flush := func(first *retryReq) {
		slots <- struct{}{} // what is queued meanwhile joins this batch
		batch := c.fillRetries(first)
		running.Go(func() {
			defer func() { <-slots }()
			c.runRetries(batch)
		})
	}
	for {
		select {
		case r := <-c.retryCh:
			flush(r)
		case <-stop:
			for {
				select {
				case r := <-c.retryCh:
					flush(r)
				default:
					return
				}
			}
		}
	}
}

// fillRetries returns the batch of first and of the jobs queued behind it.
func (c *Consumer) fillRetries(first *retryReq) []*retryReq {
	batch, size := []*retryReq{first}, first.size
	for len(batch) < maxRetryBatch && size < maxRetryBatchBytes {
		select {
		case r := <-c.retryCh:
			batch = append(batch, r)
			size += r.size
		default:
			return batch
		}
	}
	return batch
}

// runRetries runs one retry script for the retries and snoozes of batch,
// and one dead-letter script for its dead letters (see runDeads), and
// settles each job.
func (c *Consumer) runRetries(all []*retryReq) {
	var batch, dead []*retryReq
	for _, r := range all {
		if r.dead != nil {
			dead = append(dead, r)
		} else {
			batch = append(batch, r)
		}
	}
	if len(dead) > 0 {
		c.runDeads(dead)
	}
	if len(batch) == 0 {
		return
	}
	keys, args := c.retryArgs(batch)
	ctx, cancel := c.settleContext()
	res, err := retryScript.Run(ctx, c.rdb, keys, args...).Slice()
	cancel()
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("retry script: %d answers for %d jobs", len(res), len(batch))
	}
	for i, r := range batch {
		var v any
		if err == nil {
			v = res[i]
		}
		ok := c.rescheduled(r, v, err)
		if r.done != nil {
			r.done <- ok
		}
	}
}

// reschedule queues r for the next batch, or runs it alone once the batches
// have stopped (a job that finished after the drain); with r.done it
// waits for r's outcome and reports whether the job was rescheduled.
func (c *Consumer) reschedule(r *retryReq) bool {
	select {
	case <-c.retryDone:
	default:
		select {
		case c.retryCh <- r:
			return r.done == nil || <-r.done
		case <-c.retryDone:
		}
	}
	if r.done == nil {
		r.done = make(chan bool, 1)
	}
	c.runRetries([]*retryReq{r})
	return <-r.done
}

// rescheduled logs and counts the outcome of r: v is retry.lua's answer
// for it (the new entry's ID, "" in the delayed set, int64(-1): not
// owned, or int64(-2): cancelled by an operator), err the script's error. It removes the job from the in-flight set
// and reports whether the job was rescheduled.
func (c *Consumer) rescheduled(r *retryReq, v any, err error) bool {
	c.mu.Lock()
	delete(c.inflight, r.id)
	c.mu.Unlock()
	if r.room {
		c.freeRoom(1)
	}
	switch {
	case err != nil:
		attrs := append(c.jobAttrs(r.id, r.job, r.ran, r.kind, ""), slog.String("job_error", r.msg))
		c.errLog.error("scheduling a retry failed; the job stays pending and will run again", err, anys(attrs)...)
		return false
	case v == int64(-2):
		// Cancelled (control.Cancel) before this consumer heard of it:
		// acknowledged as cancelled instead.
		c.r.Logger.LogAttrs(c.base, slog.LevelInfo, "failed job was cancelled by an operator; settled as cancelled, not rescheduled",
			c.jobAttrs(r.id, r.job, r.ran, errKindCancelled, "")...)
		c.queueAck(ackItem{id: r.id, index: r.index, cancelled: true})
		return false
	case v == int64(-1):
		c.stats.stale.Add(1)
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "failed job was no longer owned by this consumer; not rescheduled here",
			c.jobAttrs(r.id, r.job, r.ran, errKindLeaseLost, r.msg)...)
		return false
	}
	c.forgetSettled(r.id)
	if !r.count {
		c.stats.snoozed.Add(1)
		// A snooze is not a failure: Debug only.
		if c.r.Logger.Enabled(c.base, slog.LevelDebug) {
			c.r.Logger.LogAttrs(c.base, slog.LevelDebug, "job snoozed; rescheduled",
				append(c.jobAttrs(r.id, r.job, r.ran, r.kind, r.msg), slog.Int64("delay_ms", r.delay.Milliseconds()))...)
		}
		return true
	}
	c.stats.retried.Add(1)
	// A retry is logged at Warn, at most once a second (with the number
	// held back since), unless the logger takes Debug: then every one is.
	held, ok := 0, c.r.Logger.Enabled(c.base, slog.LevelDebug)
	if !ok {
		held, ok = c.retryLog.allow()
	}
	if ok && c.r.Logger.Enabled(c.base, slog.LevelWarn) {
		attrs := append(c.jobAttrs(r.id, r.job, r.ran, r.kind, r.msg), slog.Int64("delay_ms", r.delay.Milliseconds()))
		if held > 0 {
			attrs = append(attrs, slog.Int("suppressed_retries", held))
		}
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "job failed; retry scheduled", attrs...)
	}
	return true
}

// retryArgs returns retry.lua's keys and arguments for batch.
func (c *Consumer) retryArgs(batch []*retryReq) ([]string, []any) {
	keys := []string{c.r.Stream, c.r.keys.Delayed}
	n := 2
	for _, r := range batch {
		n += 2 + len(r.args)
	}
	lo, hi := idRange(batch)
	args := append(make([]any, 0, n+2), c.r.Group, c.r.Consumer, lo, hi)
	for _, r := range batch {
		k := 0
		if r.index != "" {
			keys = append(keys, r.index)
			k = len(keys)
		}
		args = append(args, r.args[:3]...)
		args = append(args, k, r.err)
		args = append(args, r.args[3:]...)
	}
	return keys, args
}

// idRange returns the lowest and the highest entry ID of batch (not
// empty): retry.lua and dead.lua read this consumer's PEL over that range
// to owner-check the batch, and are given it rather than order IDs in Lua.
func idRange(batch []*retryReq) (lo, hi string) {
	lo, hi = batch[0].id, batch[0].id
	for _, r := range batch[1:] {
		if stream.CompareIDs(r.id, lo) < 0 {
			lo = r.id
		}
		if stream.CompareIDs(r.id, hi) > 0 {
			hi = r.id
		}
	}
	return lo, hi
}

// retryRequest returns the retry request of dec, a retry or snooze of the
// job of d whose handler ran under jobCtx. A suspect's next entry stays a
// suspect, and a suspect waits for its outcome.
func (c *Consumer) retryRequest(jobCtx context.Context, job *stream.Job, d delivery, dec Decision) *retryReq {
	count, delay, err := dec.Kind == KindRetry, dec.Delay, dec.Err
	t := taskOf(jobCtx)
	next := *job
	if t != nil && t.suspect {
		next.Suspect = true
	}
	msg := errText(err)
	if count {
		next.Attempt++
		next.LastError, next.ErrorHistory = withError(job, c.errorText(job, msg))
		if next.FirstFailedAt.IsZero() {
			next.FirstFailedAt = time.Now()
		}
	}
	// One slice for the job's four values and the new entry's fields, in
	// the order retry.lua takes them: no copy of the fields (40: room for
	// the values and format v1's 17 fields; AppendEncode grows it if need be).
	r := &retryReq{id: d.id, job: job, ran: t.handlerTime(), msg: msg, delay: delay, count: count}
	r.args = stream.AppendEncode(append(make([]any, 0, 40), d.id, 0, "", 0), &next)
	fields := r.args[4:]
	// retry.lua compares the delay in ms: a positive delay under 1 ms is no
	// delay, and must come with the fields of the entry to add at once.
	if delay.Milliseconds() > 0 {
		member := stream.EncodeDelayed(d.id, fields)
		r.args = append(r.args[:1], delay.Milliseconds(), member, 0)
		r.size = len(member)
	} else {
		r.args[3] = len(fields)
		for _, f := range fields {
			switch v := f.(type) {
			case string:
				r.size += len(v)
			case []byte:
				r.size += len(v)
			}
		}
	}
	if job.Track && job.ID != "" {
		r.index = stream.JobKey(c.r.keys, job.ID)
		if err != nil {
			r.err = c.errorText(job, msg)
		}
	}
	r.kind = errKindRetryable
	switch {
	case !count:
		r.kind = errKindSnooze
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(context.Cause(jobCtx), context.DeadlineExceeded):
		r.kind = errKindTimeout
	}
	if t != nil && t.suspect {
		r.done = make(chan bool, 1)
	}
	return r
}
