package consumer

// Cancels (package control): an operator cancels a running tracked job
// with control.Cancel, whose script sets the job's index record to
// "cancelling" (with the entry ID) and publishes "cancel <entry ID>" on the
// queue's control channel. The consumer that holds the entry cancels the
// handler's context with cause ErrCancelled, or, for a job not started yet
// (queued, held by a pause, a suspect waiting for its run), settles it
// without running it. Decide makes every job whose context has that cause
// KindCancelled unless its handler returned nil: the job is acknowledged
// (owner-checked, in the ack batch) with its record set to "cancelled".
//
// Nothing is done per job for this: the message carries the entry ID, which
// the consumer looks up among its in-flight jobs, and a message (or a
// missed one) is confirmed by reading the records: on a message for an
// entry it holds, and every cancelCheck while it holds tracked jobs, one
// MGET of the records of the tracked jobs it holds, so a cancel reaches the
// consumer within about cancelCheck even when Pub/Sub is lost or denied. A
// redelivered job (reclaimed from a dead consumer, re-read after a
// restart) is checked before it starts, by the script that counts its run
// (suspect.lua). Scripts that settle a job check the record too: retry.lua
// settles a job whose record says cancelling as cancelled instead of
// rescheduling it (the handler failed before the cancel reached it).

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/stream"
)

// cancelCheck is how often a consumer that holds tracked jobs reads their
// records for cancel requests it did not hear of.
const cancelCheck = time.Second

// cancelPrefix starts a cancel message on the control channel; the entry
// ID follows.
const cancelPrefix = "cancel "

// cancelEntry returns the entry ID of a cancel message, "" for any other.
func cancelEntry(payload string) string {
	id, ok := strings.CutPrefix(payload, cancelPrefix)
	if !ok || len(id) > 64 {
		return ""
	}
	return id
}

// watchCancels checks the records of the tracked jobs this consumer holds
// for cancel requests: at once when kick names an entry it holds, and
// every cancelCheck while it holds any. It returns when ctx is done.
func (c *Consumer) watchCancels(ctx context.Context, kick <-chan string) {
	timer := time.NewTimer(cancelCheck)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-kick:
			c.mu.Lock()
			_, held := c.inflight[id]
			c.mu.Unlock()
			if !held {
				continue
			}
		case <-timer.C:
			timer.Reset(cancelCheck)
		}
		c.checkCancels(ctx)
	}
}

// checkCancels reads the records of the tracked jobs this consumer holds
// and not cancelled yet, and cancels those whose record says cancelling for
// their entry. Nothing is sent when it holds none.
func (c *Consumer) checkCancels(ctx context.Context) {
	var tasks []*task
	var keys []string
	c.mu.Lock()
	for _, t := range c.inflight {
		if t.finished || t.ctx.Err() != nil || t.d.fields[stream.FieldTrack] != "1" {
			continue
		}
		id, _ := t.d.fields[stream.FieldJobID].(string)
		if id == "" {
			continue
		}
		tasks = append(tasks, t)
		keys = append(keys, stream.JobKey(c.r.keys, id))
	}
	c.mu.Unlock()
	for len(keys) > 0 {
		n := min(len(keys), maxAckBatch)
		rctx, cancel := context.WithTimeout(ctx, c.r.SettleTimeout)
		vals, err := c.rdb.MGet(rctx, keys[:n]...).Result()
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.pause.errLog.error("reading the records of running tracked jobs for cancel requests failed; trying again in "+cancelCheck.String(), err,
					"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
			}
			return
		}
		for i, v := range vals {
			s, _ := v.(string)
			if s == "" {
				continue
			}
			if r, err := stream.ParseRecord(s); err == nil && r.State == stream.StateCancelling && r.Entry == tasks[i].id {
				c.cancelTask(tasks[i])
			}
		}
		tasks, keys = tasks[n:], keys[n:]
	}
}

// cancelTask cancels t's context with cause ErrCancelled, unless its
// handler has returned already.
func (c *Consumer) cancelTask(t *task) {
	c.mu.Lock()
	finished := t.finished
	if !finished {
		t.cancel(ErrCancelled)
	}
	c.mu.Unlock()
	if !finished {
		c.r.Logger.LogAttrs(c.base, slog.LevelInfo, "job cancelled by an operator (control.Cancel); its handler's context is cancelled",
			c.entryAttrs(t.id, errKindCancelled, "")...)
	}
}
