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
// pipeline of GETs of the records of the tracked jobs it holds, so a cancel
// reaches the consumer within about cancelCheck even when Pub/Sub is lost
// or denied. Both go on while the consumer drains at shutdown, until its
// last handler has returned. A redelivered job (reclaimed from a dead
// consumer, re-read after a restart) is checked before it starts, by the
// script that counts its run (suspect.lua); a job given back at shutdown
// (its delivery count lowered, so no suspect) is checked as it is taken in
// again, one pipeline per reclaimed batch with tracked jobs in it
// (markCancelled). Scripts that settle a job check the record too: retry.lua
// settles a job whose record says cancelling as cancelled instead of
// rescheduling it (the handler failed before the cancel reached it).

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
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
	var ds []delivery
	c.mu.Lock()
	for _, t := range c.inflight {
		if t.finished || t.ctx.Err() != nil || trackedID(t.d) == "" {
			continue
		}
		tasks = append(tasks, t)
		ds = append(ds, t.d)
	}
	c.mu.Unlock()
	err := c.readCancelling(ctx, ds, func(i int) { c.cancelTask(tasks[i]) })
	if err != nil && ctx.Err() == nil {
		c.pause.errLog.error("reading the records of running tracked jobs for cancel requests failed; trying again in "+cancelCheck.String(), err,
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
}

// markCancelled sets the cancelled mark of the deliveries re-read or
// reclaimed (ds) whose tracked job's record says cancelling for that entry:
// a job given back at shutdown, or left by a consumer that stopped, after
// an operator cancelled it. They are settled cancelled without running.
// Suspects are skipped (suspect.lua checks their records as it counts
// their run), and so are untracked jobs: nothing is sent when no other is
// left. A failed read is logged; the jobs then run, and the check of
// running jobs (checkCancels) cancels them within cancelCheck.
func (c *Consumer) markCancelled(ds []delivery) {
	var idx []int
	var check []delivery
	for i, d := range ds {
		if !c.isSuspect(d, false) && trackedID(d) != "" {
			idx = append(idx, i)
			check = append(check, d)
		}
	}
	if len(check) == 0 {
		return
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	if err := c.readCancelling(ctx, check, func(i int) { ds[idx[i]].cancelled = true }); err != nil {
		c.pause.errLog.error("reading the records of reclaimed tracked jobs for cancel requests failed; they run, and are cancelled once the check of running jobs reads them", err,
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer)
	}
}

// readCancelling reads the records of the tracked jobs of ds, one
// pipeline of GETs per maxAckBatch (GET, not MGET: the consumer's ACL line
// in docs/acl.md has it already), and calls found with the index of each
// whose record says cancelling for its entry.
func (c *Consumer) readCancelling(ctx context.Context, ds []delivery, found func(i int)) error {
	for start := 0; start < len(ds); start += maxAckBatch {
		part := ds[start:min(len(ds), start+maxAckBatch)]
		gets := make([]*redis.StringCmd, len(part))
		rctx, cancel := context.WithTimeout(ctx, c.r.SettleTimeout)
		_, err := c.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
			for i, d := range part {
				gets[i] = p.Get(rctx, stream.JobKey(c.r.keys, trackedID(d)))
			}
			return nil
		})
		cancel()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i, g := range gets {
			s, err := g.Result()
			switch {
			case errors.Is(err, redis.Nil):
				continue
			case err != nil:
				return err
			}
			if r, err := stream.ParseRecord(s); err == nil && r.State == stream.StateCancelling && r.Entry == part[i].id {
				found(start + i)
			}
		}
	}
	return nil
}

// trackedID returns the job ID of d's job if it is tracked, else "".
func trackedID(d delivery) string {
	if stream.Field(d.fields, stream.FieldTrack) != "1" {
		return ""
	}
	id := stream.Field(d.fields, stream.FieldJobID)
	return id
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
