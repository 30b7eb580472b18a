package stream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/refusal"
)

// The delayed set holds jobs that must not run before a given time: retries
// waiting for their backoff and jobs scheduled by producers. It is a sorted
// set ([Keys].Delayed) whose score is the due time in Unix milliseconds and
// whose member is the whole entry to add, encoded by [EncodeDelayed].
// [PromoteDue] moves due jobs into the stream; every consumer runs it.

var (
	//go:embed promote.lua
	promoteLua string
	//go:embed schedule.lua
	scheduleLua string

	promoteScript  = redis.NewScript(promoteLua)
	scheduleScript = redis.NewScript(scheduleLua)
	// scheduleRefusals are the error replies schedule.lua gives only
	// before its first write, the ZADD (its commands are checked first, and
	// the marker read before): the call scheduled nothing.
	scheduleRefusals = append([]string{"WRONGTYPE "}, refusal.Before...)
)

// EncodeDelayed encodes the entry fields (as [Encode] returns them) of a job
// for the delayed set: "<key>|" then each name and value as
// "<byte length>:<bytes>". key makes the member unique: the source entry ID
// of a retry, the job ID of a scheduled job. Since the first '|' ends the
// key, a '|' in key is written as "%7C" (and '%' as "%25"); DecodeDelayed
// restores it.
func EncodeDelayed(key string, fields []any) string {
	var b strings.Builder
	if strings.ContainsAny(key, "|%") {
		key = delayedKeyEscaper.Replace(key)
	}
	b.WriteString(key)
	b.WriteByte('|')
	for _, f := range fields {
		var s string
		switch v := f.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		default:
			s = fmt.Sprint(v)
		}
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}

var (
	delayedKeyEscaper   = strings.NewReplacer("%", "%25", "|", "%7C")
	delayedKeyUnescaper = strings.NewReplacer("%25", "%", "%7C", "|")
)

// DecodeDelayed is the inverse of [EncodeDelayed]: it returns the member's
// key and fields.
func DecodeDelayed(member string) (key string, fields []string, err error) {
	key, rest, ok := strings.Cut(member, "|")
	if !ok {
		return "", nil, errors.New("stream: delayed member has no '|'")
	}
	if strings.Contains(key, "%") {
		key = delayedKeyUnescaper.Replace(key)
	}
	for rest != "" {
		n, tail, ok := strings.Cut(rest, ":")
		l, err := strconv.Atoi(n)
		if !ok || err != nil || l < 0 || l > len(tail) {
			return "", nil, errors.New("stream: delayed member does not parse")
		}
		fields = append(fields, tail[:l])
		rest = tail[l:]
	}
	if len(fields) == 0 || len(fields)%2 != 0 {
		return "", nil, errors.New("stream: delayed member has no fields, or an odd number")
	}
	return key, fields, nil
}

// EnqueueAt schedules job to be added to the stream at t (by this
// process's clock; see [Producer.EnqueueIn] for a delay measured by the
// Redis clock). Scheduling the same job (same ID and fields) again moves
// its time instead of adding a copy. With [ProducerConfig].EnqueueOnce, a
// job with an IdempotencyKey is scheduled at most once while its marker
// lives (until its due time plus the window): a repeat schedules nothing,
// moves nothing, and sets job.ID to the first job's ID.
//
// An error says "(not scheduled)" when Redis refused the script before it
// wrote anything, and "(outcome unknown)" when the reply was lost (the job
// may be scheduled), exact under the same terms as Enqueue's "(not
// enqueued)" (see [Producer]); both wrap the go-redis error.
func (p *Producer) EnqueueAt(ctx context.Context, job *Job, t time.Time) error {
	return p.schedule(ctx, job, "at", t.UnixMilli())
}

// EnqueueIn schedules job to be added to the stream after d, measured by
// the Redis server's clock, so that producers and consumers with skewed
// clocks agree on when it is due. Its errors are EnqueueAt's.
func (p *Producer) EnqueueIn(ctx context.Context, job *Job, d time.Duration) error {
	return p.schedule(ctx, job, "in", d.Milliseconds())
}

func (p *Producer) schedule(ctx context.Context, job *Job, mode string, ms int64) error {
	var args redis.XAddArgs
	if _, err := p.args(ctx, job, &args, nil); err != nil {
		return err
	}
	member := EncodeDelayed(job.ID, args.Values.([]any))
	keys, argv := p.scheduleArgs(job, mode, ms, member)
	v, err := scheduleScript.Run(ctx, p.rdb, keys, argv...).Slice()
	if err != nil && refusal.Script(err, scheduleRefusals...) {
		return fmt.Errorf("stream: schedule %s job %s (not scheduled): %w", job.Type, job.ID, err)
	}
	if err != nil {
		return fmt.Errorf("stream: schedule %s job %s (outcome unknown): %w", job.Type, job.ID, err)
	}
	if len(v) == 3 {
		if first, ok := v[1].(string); ok && first != "" {
			job.ID = first
		}
	}
	return nil
}

// PromoteDue moves up to limit jobs whose time has come (by the Redis
// clock) from stream's delayed set into the stream, and returns how many it
// moved. Each move is part of one script, so many processes may promote the
// same set at once: no job is lost or added twice. A member that does not
// parse goes to the stream's default dead-letter stream with reason
// "malformed". The script writes only the index records it is given: when
// due jobs are tracked, the first call moves the jobs before the first of
// them and names their records, and a second call, with those records in
// its keys, moves them (a third at most, for jobs that became due between
// the two).
func PromoteDue(ctx context.Context, rdb redis.Scripter, stream string, limit int) (int, error) {
	keys, err := KeysFor(stream)
	if err != nil {
		return 0, err
	}
	base := []string{keys.Stream, keys.Delayed, keys.Dead}
	ks, moved := base, 0
	for range 3 {
		v, err := promoteScript.Run(ctx, rdb, ks, limit-moved).Slice()
		if err != nil {
			return moved, fmt.Errorf("stream: promote due jobs of %s: %w", stream, err)
		}
		var n int64
		ok := len(v) > 0
		if ok {
			n, ok = v[0].(int64)
		}
		if !ok {
			return moved, fmt.Errorf("stream: promote due jobs of %s: the script returned no count", stream)
		}
		moved += int(n)
		if len(v) == 1 || moved >= limit {
			return moved, nil
		}
		ks = slices.Clip(base)
		for _, r := range v[1:] {
			name, ok := r.(string)
			if !ok || !strings.HasPrefix(name, keys.Job) {
				return moved, fmt.Errorf("stream: promote due jobs of %s: the script named a record outside the queue", stream)
			}
			ks = append(ks, name)
		}
	}
	return moved, nil
}
