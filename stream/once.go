package stream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/refusal"
)

// Enqueue once: with [ProducerConfig].EnqueueOnce, a job with an
// IdempotencyKey is added by enqueue.lua, which adds it and sets its marker
// ([Keys].Once + key) together, unless the marker exists. The script is the
// contract for producers in other languages too (docs/wire-format.md).

var (
	//go:embed enqueue.lua
	enqueueLua    string
	enqueueScript = redis.NewScript(enqueueLua)
	// enqueueRefusals are the error replies enqueue.lua gives only before
	// its first write (see its header): the call added nothing.
	enqueueRefusals = append([]string{"WRONGTYPE ", "ERR enqueue.lua:"}, refusal.Before...)
)

// OnceBatch is the most jobs one enqueue-once script adds: a larger
// EnqueueBatch is sent as several scripts in one pipeline, so that no
// script blocks Redis for long.
const OnceBatch = 100

// onceKey returns the key job is enqueued once by, "" for none.
func (p *Producer) onceKey(job *Job) string {
	if p.cfg.EnqueueOnce <= 0 {
		return ""
	}
	if p.cfg.OnceKey != nil {
		return p.cfg.OnceKey(job)
	}
	return job.IdempotencyKey
}

// once reports whether job is enqueued once.
func (p *Producer) once(job *Job) bool { return p.onceKey(job) != "" }

// OnceKey returns the enqueue-once marker of idempotency key key in stream's
// namespace, [Keys].Once + key.
func OnceKey(stream, key string) (string, error) {
	keys, err := KeysFor(stream)
	if err != nil {
		return "", err
	}
	return keys.Once + key, nil
}

// send adds jobs (with their XADD args) in one pipeline, in order: a
// plain job as an XADD, each run of consecutive scripted jobs as enqueue
// scripts of at most OnceBatch jobs (EVAL until Redis has run the script
// for this producer, then EVALSHA; EVAL again, in a second round trip and
// so after the batch's XADDs, for those Redis answered NOSCRIPT: it lost
// its script cache). It returns each job's
// entry ID ("" for a job not added because of an error), sets the ID of
// each duplicate to its first job's, and joins the errors, each "not
// enqueued" or "maybe enqueued" ("outcome unknown") for its jobs.
func (p *Producer) send(ctx context.Context, jobs []*Job, all []*redis.XAddArgs) ([]string, error) {
	type chunk struct {
		from, to int
		keys     []string
		args     []any
		cmd      *redis.Cmd
	}
	var (
		chunks []*chunk
		xadds  = make([]*redis.StringCmd, len(jobs))
		keys   Keys
	)
	for i := 0; i < len(jobs); {
		if !p.scripted(jobs[i]) {
			i++
			continue
		}
		if keys.Job == "" {
			keys, _ = KeysFor(p.cfg.Stream) // valid: args checked cfg
		}
		c := &chunk{from: i, keys: []string{p.cfg.Stream}}
		c.args = append(c.args, p.cfg.MaxLen, p.cfg.EnqueueOnce.Milliseconds(), 0)
		for ; i < len(jobs) && i-c.from < OnceBatch && p.scripted(jobs[i]); i++ {
			marker := 0
			if k := p.onceKey(jobs[i]); k != "" {
				c.keys = append(c.keys, p.onceAt+k)
				marker = len(c.keys)
			}
			if jobs[i].Track {
				c.keys = append(c.keys, JobKey(keys, jobs[i].ID))
			}
			fields := all[i].Values.([]any)
			c.args = append(c.args, marker, jobs[i].ID, len(fields))
			c.args = append(c.args, fields...)
		}
		c.to = i
		c.args[2] = c.to - c.from
		chunks = append(chunks, c)
	}
	eval := func(pipe redis.Pipeliner, c *chunk, again bool) {
		if again {
			c.cmd = enqueueScript.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			c.cmd = enqueueScript.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	loaded := p.loaded.Load() // else EVAL: the scripts keep their place in the batch
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		next := 0
		for i := 0; i < len(jobs); {
			if next < len(chunks) && chunks[next].from == i {
				eval(pipe, chunks[next], !loaded)
				i = chunks[next].to
				next++
				continue
			}
			xadds[i] = pipe.XAdd(ctx, all[i])
			i++
		}
		return nil
	})
	var again []*chunk
	for _, c := range chunks {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, c) // not run: the script cache was empty
		}
	}
	if len(chunks) > 0 {
		p.loaded.Store(len(again) == 0)
	}
	if len(again) > 0 {
		_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, c := range again {
				eval(pipe, c, true)
			}
			return nil
		})
	}

	ids := make([]string, len(jobs))
	errs := make([]error, len(jobs)) // in the jobs' order
	failed := func(i int, err error, refused bool) {
		outcome := "outcome unknown"
		if refused {
			outcome = "not enqueued"
		}
		errs[i] = fmt.Errorf("stream: enqueue %s job %s (%s): %w", jobs[i].Type, jobs[i].ID, outcome, err)
	}
	for i, x := range xadds {
		if x == nil {
			continue
		}
		if id, err := x.Result(); err != nil {
			failed(i, err, refusal.Command(err))
		} else {
			ids[i] = id
		}
	}
	for _, c := range chunks {
		fail := func(err error) {
			refused := refusal.Script(err, enqueueRefusals...)
			for i := c.from; i < c.to; i++ {
				failed(i, err, refused)
			}
		}
		v, err := c.cmd.Slice()
		if err != nil {
			fail(err)
			continue
		}
		if len(v) != c.to-c.from {
			fail(fmt.Errorf("enqueue script returned %d results for %d jobs", len(v), c.to-c.from))
			continue
		}
		for k, r := range v {
			entry, jobID, err := onceResult(r)
			if err != nil {
				fail(err)
				break
			}
			ids[c.from+k] = entry
			jobs[c.from+k].ID = jobID
		}
	}
	return ids, errors.Join(errs...)
}

// onceResult parses one job's {entry id, job id, duplicate} reply.
func onceResult(r any) (entry, jobID string, err error) {
	t, ok := r.([]any)
	if !ok || len(t) != 3 {
		return "", "", fmt.Errorf("enqueue script returned %T, not a triple", r)
	}
	entry, ok1 := t[0].(string)
	jobID, ok2 := t[1].(string)
	if !ok1 || !ok2 {
		return "", "", errors.New("enqueue script returned a non-string ID")
	}
	return entry, jobID, nil
}

// scheduleArgs returns the schedule script's keys and arguments for job,
// with its marker when it is enqueued once.
func (p *Producer) scheduleArgs(job *Job, mode string, ms int64, member string) ([]string, []any) {
	keys, _ := KeysFor(p.cfg.Stream)
	k := p.onceKey(job)
	if k == "" && !job.Track {
		return []string{keys.Delayed}, []any{mode, ms, member}
	}
	ks, window := []string{keys.Delayed}, "0"
	if k != "" {
		ks, window = append(ks, p.onceAt+k), strconv.FormatInt(p.cfg.EnqueueOnce.Milliseconds(), 10)
	}
	argv := []any{mode, ms, member, window, job.ID}
	if job.Track {
		ks, argv = append(ks, JobKey(keys, job.ID)), append(argv, "1")
	}
	return ks, argv
}
