package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"

	"github.com/pelicanqueue/pelican/stream"
)

// DeadLetter describes a job as it is dead-lettered: what
// [Config.OnDeadLetter] is given.
type DeadLetter struct {
	// Job is the decoded job; nil for an entry that did not decode.
	Job *stream.Job
	// EntryID is the source entry's ID.
	EntryID string
	// Stream is the source stream.
	Stream string
	// DeadLetterStream is where the entry goes.
	DeadLetterStream string
	// Reason is the dead_reason, such as [ReasonExhausted].
	Reason string
	// Error is the dead_error text.
	Error string
	// Attempts is the number of attempts made.
	Attempts int
	// DeadEntryID is the dead-letter entry's ID, set once it is written
	// (in [Config.OnDeadLetter]).
	DeadEntryID string
}

// deadReq is a job to dead-letter in the retry loop's next batch: its
// dead.lua values, and what is logged and given to Config.OnDeadLetter once
// the script has run.
type deadReq struct {
	// args are the job's dead.lua values without the index (entry ID,
	// reason, error, attempts, mode), set the pairs to set in the copy, and
	// fields the entry's fields to record (mode "record:<size>"); read are
	// the fields as the consumer read them (names and values in order), sent
	// only when the entry is no longer in the stream (dead.lua's -2).
	args   []any
	set    []any
	fields []any
	read   []string
	left   int // the fields of the entry left out of read (recordedFields)
	index  string
	info   DeadLetter
}

// recordedFields is the most fields (name/value pairs) of an entry that its
// dead letter holds (dead.lua's ARGV[7]): stream.MaxFields, the format's
// own and a margin. An entry with more keeps one value per name (the last,
// the one the decoder reads), the names in the order they first come, and
// at most that many of those; the fields left out are counted
// (dead_dropped_fields). When the dead letter is made from what the
// consumer read, the consumer applies that rule itself (firstFields), so
// that an entry of many fields (or of one name given many times: those
// count once toward the limits) never sends more back to Redis.
const recordedFields = 1100

// firstFields returns what a dead letter holds of pairs (see
// recordedFields) and how many fields it leaves out.
func firstFields(pairs []string) ([]string, int) {
	n := len(pairs) / 2
	if n <= recordedFields {
		return pairs, 0
	}
	at := make(map[string]int, recordedFields) // name: index of its value in out
	out := make([]string, 0, 2*recordedFields)
	for i := 0; i+1 < len(pairs); i += 2 {
		if j, ok := at[pairs[i]]; ok {
			out[j] = pairs[i+1]
		} else if len(out) < 2*recordedFields {
			at[pairs[i]] = len(out) + 1
			out = append(out, pairs[i], pairs[i+1])
		}
	}
	return out, n - len(out)/2
}

// deadRequest returns the request that dead-letters the entry of dv with
// reason, cause and attempts made, with Config.RedactDeadLetter's field
// values. job is nil for an entry that did not decode; jobCtx is the
// context its handler ran under.
func (c *Consumer) deadRequest(jobCtx context.Context, dv delivery, reason string, cause error, attempts int, job *stream.Job) *retryReq {
	id, pairs := dv.id, dv.fields
	msg := errText(cause)
	stored := c.errorText(job, msg) // what dead_error holds
	d := &deadReq{info: DeadLetter{Job: job, EntryID: id, Stream: c.r.Stream,
		DeadLetterStream: c.r.DeadLetterStream, Reason: reason, Error: stored, Attempts: attempts}}
	d.read, d.left = firstFields(pairs)
	if dv.cut != nil { // cut short in Redis as firstFields and cutShort would
		d.read, d.left = pairs, dv.cut.Left
	}
	set := make(map[string]string)
	if job != nil && msg != "" {
		// The record carries the final error, as a retry would (the
		// handler's own, without the "attempt n of m" of dead_error).
		final := msg
		var ex *exhaustedError
		if errors.As(cause, &ex) {
			final = errText(ex.err)
		}
		last, history := withError(job, c.errorText(job, final))
		set[stream.FieldLastError] = last
		b, _ := json.Marshal(history)
		set[stream.FieldErrorHistory] = string(b)
	}
	if c.r.RedactDeadLetter != nil && job != nil {
		for k, v := range c.r.RedactDeadLetter(job) {
			if hasField(pairs, k) { // a replacement, never a new field
				set[k] = v
			}
		}
	}
	r := &retryReq{id: id, job: job, ran: taskOf(jobCtx).handlerTime(), kind: deadKind(reason), msg: msg, dead: d}
	mode := "copy"
	if de := (*stream.DecodeError)(nil); errors.As(cause, &de) && de.Size > 0 {
		// Over the size limit: recorded cut short, from what the consumer
		// read; copying it whole would hold several copies of it in Redis.
		mode = "record:" + strconv.Itoa(de.Size)
		d.read = cutShort(d.read)
		d.fields = appendFields(nil, d.read)
	}
	d.args = []any{id, reason, stored, attempts, mode}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		d.set = append(d.set, k, set[k])
		r.size += len(k) + len(set[k])
	}
	// What dead.lua holds of the entry: its copy, or the fields recorded.
	for _, s := range d.read {
		r.size += len(s)
	}
	if job != nil && job.Track && job.ID != "" {
		d.index = stream.JobKey(c.r.keys, job.ID)
	}
	return r
}

// settleDead dead-letters the job of r (see deadRequest) in the retry
// loop's next batch, then, when it was written, calls Config.OnDeadLetter
// with ctx's values: only then (and for a suspect) does the worker wait for
// the batch.
func (c *Consumer) settleDead(ctx context.Context, r *retryReq, suspect bool) {
	if c.r.OnDeadLetter != nil || suspect {
		r.done = make(chan bool, 1)
	}
	if c.reschedule(r) && c.r.OnDeadLetter != nil {
		c.r.OnDeadLetter(context.WithoutCancel(ctx), r.dead.info)
	}
}

// runDeads runs one dead.lua for batch, again for the entries gone from the
// stream meanwhile with the fields as read, and settles each job (see
// deadLettered).
func (c *Consumer) runDeads(batch []*retryReq) {
	res, trimmed, err := c.deadScriptRun(batch, false)
	var gone []*retryReq
	for i, r := range batch {
		if err == nil && res[i] == int64(-2) {
			gone = append(gone, r)
		}
	}
	if len(gone) > 0 {
		// Trimmed from the stream while pending: record what was read. Only
		// then do the fields travel back to Redis.
		again, more, gerr := c.deadScriptRun(gone, true)
		trimmed += more
		for i, r := range gone {
			if gerr != nil {
				c.deadLettered(r, nil, gerr)
			} else {
				c.deadLettered(r, again[i], nil)
			}
		}
	}
	for i, r := range batch {
		switch {
		case err != nil:
			c.deadLettered(r, nil, err)
		case res[i] != int64(-2):
			c.deadLettered(r, res[i], nil)
		}
	}
	if trimmed > 0 {
		c.stats.deadTrimmed.Add(uint64(trimmed))
		c.r.Logger.Warn("the dead-letter stream is over Config.DeadLetterMaxLen: its oldest entries were removed",
			"stream", c.r.Stream, "group", c.r.Group, "consumer", c.r.Consumer,
			"dead_letter_stream", c.r.DeadLetterStream, "removed", trimmed, "max_len", c.r.DeadLetterMaxLen)
	}
}

// deadScriptRun runs dead.lua for batch, with each entry's fields as read
// when read is set, and returns its answer per job and the entries trimmed.
func (c *Consumer) deadScriptRun(batch []*retryReq, read bool) ([]any, int64, error) {
	keys := []string{c.r.Stream, c.r.DeadLetterStream}
	lo, hi := idRange(batch)
	args := []any{c.r.Group, c.r.Consumer, c.r.DeadLetterMaxLen, c.r.TrackTTL.Milliseconds(), lo, hi, recordedFields}
	for _, r := range batch {
		d := r.dead
		k := 0
		if d.index != "" {
			keys = append(keys, d.index)
			k = len(keys)
		}
		fields := d.fields
		if read && fields == nil {
			fields = appendFields(nil, d.read)
		}
		args = append(args, d.args...)
		args = append(args, k, len(d.set), len(fields), d.left)
		args = append(args, d.set...)
		args = append(args, fields...)
	}
	ctx, cancel := c.settleContext()
	defer cancel()
	res, err := deadScript.Run(ctx, c.rdb, keys, args...).Slice()
	if err == nil && len(res) != 1+len(batch) {
		err = fmt.Errorf("dead-letter script: %d answers for %d jobs", len(res), len(batch))
	}
	if err != nil {
		return nil, 0, err
	}
	trimmed, _ := res[0].(int64)
	return res[1:], trimmed, nil
}

// deadLettered logs and counts the outcome of r, a dead letter: v is
// dead.lua's answer for it (its dead-letter entry ID, or int64(-1): not
// owned), err the script's error. It removes the job from the in-flight set
// and reports it to r.done.
func (c *Consumer) deadLettered(r *retryReq, v any, err error) {
	c.mu.Lock()
	delete(c.inflight, r.id)
	c.mu.Unlock()
	if r.room {
		c.freeRoom(1)
	}
	d, ok := r.dead, false
	defer func() {
		if r.done != nil {
			r.done <- ok
		}
	}()
	id, _ := v.(string)
	switch {
	case err != nil:
		attrs := append(c.jobAttrs(r.id, r.job, r.ran, r.kind, ""), slog.String("dead_reason", d.info.Reason), slog.String("job_error", d.info.Error))
		c.errLog.error("dead-lettering failed; the job stays pending and will be delivered again", err, anys(attrs)...)
		return
	case id == "":
		c.stats.stale.Add(1)
		c.r.Logger.LogAttrs(c.base, slog.LevelWarn, "job to dead-letter was no longer owned by this consumer; not dead-lettered here",
			append(c.jobAttrs(r.id, r.job, r.ran, errKindLeaseLost, r.msg), slog.String("dead_reason", d.info.Reason))...)
		return
	}
	ok, d.info.DeadEntryID = true, id
	c.forgetSettled(r.id)
	c.stats.dead.Add(1)
	c.r.Logger.LogAttrs(c.base, slog.LevelError, "job dead-lettered", append(c.jobAttrs(r.id, r.job, r.ran, r.kind, r.msg),
		slog.String("dead_reason", d.info.Reason), slog.String("dead_letter_stream", c.r.DeadLetterStream), slog.String("dead_entry_id", id))...)
}
