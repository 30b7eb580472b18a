package control

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed pause.lua
	pauseLua    string
	pauseScript = redis.NewScript(pauseLua)
	//go:embed resume.lua
	resumeLua    string
	resumeScript = redis.NewScript(resumeLua)
)

// MaxPauses is the most pauses (the queue's and its types') a queue may
// hold at once; Pause of one more fails. It bounds what every consumer
// reads on each change.
const MaxPauses = 1000

// MaxTypeBytes is the longest job type Pause accepts.
const MaxTypeBytes = 256

// fieldQueue is the pause hash's field of a whole-queue pause; a type's is
// typePrefix + type.
const (
	fieldQueue = "queue"
	typePrefix = "type:"
)

// ErrNotPaused is returned by Resume when there was no pause to lift.
var ErrNotPaused = errors.New("control: not paused")

// ErrNotFuture is matched (errors.Is) by the error of a pause whose
// PauseOptions.Until is not in the future, by the local clock (Validate)
// or by the Redis clock (Pause).
var ErrNotFuture = errors.New("control: PauseOptions.Until is not in the future")

// PauseOptions say what Pause pauses and until when.
type PauseOptions struct {
	// Type, when set, pauses only the jobs of this type; other types keep
	// running. At most [MaxTypeBytes] bytes of valid UTF-8 without control
	// characters. Defaults to "": the whole queue.
	Type string
	// Until, when set, ends the pause by itself at this time of the Redis
	// clock, without any message. It must be in the future. Defaults to the
	// zero time: until Resume.
	Until time.Time
}

// Validate reports bad options, naming the field.
func (o PauseOptions) Validate() error {
	if err := validType("PauseOptions.Type", o.Type); err != nil {
		return err
	}
	if !o.Until.IsZero() && !o.Until.After(time.Now()) {
		return fmt.Errorf("%w (%s)", ErrNotFuture, o.Until.Format(time.RFC3339))
	}
	return nil
}

// ResumeOptions say which pause Resume lifts.
type ResumeOptions struct {
	// All lifts every pause of the queue: its own and every type's. Type
	// must then be empty. Defaults to false.
	All bool
	// Type lifts the pause of this job type. Defaults to "": the pause of
	// the whole queue (the types' pauses stay).
	Type string
}

// Validate reports bad options, naming the field.
func (o ResumeOptions) Validate() error {
	if o.All && o.Type != "" {
		return errors.New("control: ResumeOptions.Type must be empty with ResumeOptions.All")
	}
	return validType("ResumeOptions.Type", o.Type)
}

func validType(field, t string) error {
	switch {
	case len(t) > MaxTypeBytes:
		return fmt.Errorf("control: %s is %d bytes; at most %d", field, len(t), MaxTypeBytes)
	case !utf8.ValidString(t):
		return fmt.Errorf("control: %s is not valid UTF-8", field)
	case strings.IndexFunc(t, unicode.IsControl) >= 0:
		return fmt.Errorf("control: %s %q has control characters", field, t)
	}
	return nil
}

func field(typ string) string {
	if typ == "" {
		return fieldQueue
	}
	return typePrefix + typ
}

func keys(s string) (stream.Keys, error) {
	if s == "" {
		return stream.Keys{}, errors.New("control: empty stream name")
	}
	k, err := stream.KeysFor(s)
	if err != nil {
		return stream.Keys{}, fmt.Errorf("control: %w", err)
	}
	return k, nil
}

// Pause pauses the queue of stream s, or the jobs of one type of it, until
// [Resume] or opts.Until. Pausing what is paused already replaces its end.
// Every consumer of the queue stops starting such jobs within about a
// second; running jobs finish. Bad options are an error naming the field,
// returned before Redis is touched; an Until that the Redis clock has
// passed already is an error too.
func Pause(ctx context.Context, rdb redis.UniversalClient, s string, opts PauseOptions) error {
	k, err := keys(s)
	if err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	until := "0"
	if !opts.Until.IsZero() {
		until = strconv.FormatInt(opts.Until.UnixMilli(), 10)
	}
	err = pauseScript.Run(ctx, rdb, []string{k.Paused}, field(opts.Type), until, k.Control, MaxPauses).Err()
	switch {
	case err == nil:
		return nil
	case strings.HasPrefix(err.Error(), "PAST "):
		return fmt.Errorf("%w: %s is not after the Redis clock (%s)", ErrNotFuture,
			opts.Until.Format(time.RFC3339Nano), msTime(strings.TrimPrefix(err.Error(), "PAST ")).Format(time.RFC3339Nano))
	case strings.HasPrefix(err.Error(), "FULL "):
		return fmt.Errorf("control: queue %s has %d pauses already, the most allowed (MaxPauses); resume some first", s, MaxPauses)
	}
	return fmt.Errorf("control: pausing %s: %w", s, err)
}

// Resume lifts a pause of the queue of stream s (see [ResumeOptions]).
// Consumers start the jobs it held within about a second. It returns
// [ErrNotPaused] when there was no pause to lift (it still tells the
// consumers to re-read).
func Resume(ctx context.Context, rdb redis.UniversalClient, s string, opts ResumeOptions) error {
	k, err := keys(s)
	if err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	f := field(opts.Type)
	if opts.All {
		f = ""
	}
	n, err := resumeScript.Run(ctx, rdb, []string{k.Paused}, f, k.Control).Int64()
	if err != nil {
		return fmt.Errorf("control: resuming %s: %w", s, err)
	}
	if n == 0 {
		return ErrNotPaused
	}
	return nil
}

// Paused is what is paused in a queue, read at one instant of the Redis
// clock. Pauses that had ended by then are left out.
type Paused struct {
	// Now is the Redis clock when the state was read.
	Now time.Time
	// Queue is true while the whole queue is paused.
	Queue bool
	// QueueUntil is when the queue's pause ends by itself; zero: at Resume.
	QueueUntil time.Time
	// Types are the paused job types, each with the end of its pause (zero:
	// at Resume).
	Types map[string]time.Time
}

// Any reports whether anything is paused.
func (p Paused) Any() bool { return p.Queue || len(p.Types) > 0 }

// TypeNames returns the paused types, sorted.
func (p Paused) TypeNames() []string {
	out := make([]string, 0, len(p.Types))
	for t := range p.Types {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// State reads what is paused in the queue of stream s.
func State(ctx context.Context, rdb redis.UniversalClient, s string) (Paused, error) {
	k, err := keys(s)
	if err != nil {
		return Paused{}, err
	}
	// TIME and HGETALL, not a script: a read-only Redis user may read the
	// state (see docs/acl.md).
	var now *redis.TimeCmd
	var all *redis.MapStringStringCmd
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		all = p.HGetAll(ctx, k.Paused)
		return nil
	}); err != nil {
		return Paused{}, fmt.Errorf("control: reading the pauses of %s: %w", s, err)
	}
	return ParseState(now.Val(), all.Val()), nil
}

// ParseState returns the pauses in the fields of a queue's pause hash
// (stream.KeysFor(stream).Paused, read with HGETALL) at time now of the
// Redis clock; fields that Pause did not write are ignored. [State] reads
// and parses; ParseState is for a reader that pipelines the HGETALL with
// other reads.
func ParseState(now time.Time, all map[string]string) Paused {
	p := Paused{Now: now}
	nowMs := now.UnixMilli()
	for name, v := range all {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			continue // not written by Pause: ignored
		}
		if ms != 0 && ms <= nowMs {
			continue // ended
		}
		var until time.Time
		if ms != 0 {
			until = time.UnixMilli(ms)
		}
		switch {
		case name == fieldQueue:
			p.Queue, p.QueueUntil = true, until
		case strings.HasPrefix(name, typePrefix):
			if p.Types == nil {
				p.Types = make(map[string]time.Time)
			}
			p.Types[strings.TrimPrefix(name, typePrefix)] = until
		}
	}
	return p
}

func msTime(s string) time.Time {
	ms, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return time.UnixMilli(ms)
}
