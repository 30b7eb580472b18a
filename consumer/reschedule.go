package consumer

import (
	"fmt"
)

// Rescheduling: jobs whose attempt failed (or that snoozed) are rescheduled
// in batches, one retry script for all the jobs that finished meanwhile, as
// acknowledgements are (see ackLoop). A job's goroutine waits for its batch,
// so that it logs and counts its own outcome.

// maxRetryBatch bounds the jobs one retry script reschedules, and
// maxRetryBatchBytes the bytes of their fields (a batch takes at least one
// job, whatever its size).
const (
	maxRetryBatch      = 64
	maxRetryBatchBytes = 1 << 20
)

// retryReq is one job to reschedule: its retry.lua values (entry ID,
// delay, member, count, fields) and their size in bytes.
type retryReq struct {
	// args are the job's values for retry.lua without the index and error
	// (entry ID, delay, member, n, values); index and err are the job's
	// index record ("" when untracked) and the error to record.
	args       []any
	index, err string
	size       int
	done       chan retryRes
}

// retryRes is retry.lua's answer for one job: the new entry's ID, "" (in
// the delayed set) or int64(-1) (not owned), or the script's error.
type retryRes struct {
	v   any
	err error
}

// retryLoop runs the batches until stop is closed and nobody waits to send.
func (c *Consumer) retryLoop(stop <-chan struct{}) {
	defer close(c.retryDone)
	for {
		select {
		case r := <-c.retryCh:
			c.flushRetries(r)
		case <-stop:
			for {
				select {
				case r := <-c.retryCh:
					c.flushRetries(r)
				default:
					return
				}
			}
		}
	}
}

// flushRetries runs one retry script for first and for the jobs waiting
// behind it, and answers each.
func (c *Consumer) flushRetries(first *retryReq) {
	batch, size := []*retryReq{first}, first.size
fill:
	for len(batch) < maxRetryBatch && size < maxRetryBatchBytes {
		select {
		case r := <-c.retryCh:
			batch = append(batch, r)
			size += r.size
		default:
			break fill
		}
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
		r.done <- retryRes{v, err}
	}
}

// reschedule runs one job's retry.lua values in the next batch, or alone
// once the batches have stopped (a job that finished after the drain).
func (c *Consumer) reschedule(args []any, size int, index, errText string) (any, error) {
	r := &retryReq{args: args, size: size, index: index, err: errText, done: make(chan retryRes, 1)}
	select {
	case c.retryCh <- r:
		res := <-r.done
		return res.v, res.err
	case <-c.retryDone:
		ctx, cancel := c.settleContext()
		defer cancel()
		keys, all := c.retryArgs([]*retryReq{r})
		res, err := retryScript.Run(ctx, c.rdb, keys, all...).Slice()
		if err != nil {
			return nil, err
		}
		if len(res) != 1 {
			return nil, fmt.Errorf("retry script: %d answers for 1 job", len(res))
		}
		return res[0], nil
	}
}

// retryArgs returns retry.lua's keys and arguments for batch.
func (c *Consumer) retryArgs(batch []*retryReq) ([]string, []any) {
	keys := []string{c.r.Stream, c.r.keys.Delayed}
	args := []any{c.r.Group, c.r.Consumer}
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
