package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [Config].
const (
	// DefaultCursorTTL is how long an interrupted replay's cursor is kept.
	DefaultCursorTTL = 24 * time.Hour
	// DefaultLeaseTTL is how long a replay's lease outlives its last renewal.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultPageSize is how many entries one XRANGE reads.
	DefaultPageSize = 100
	// DefaultListLimit is how many entries List returns when its limit is 0.
	DefaultListLimit = 100
)

// Field names that consumer/dead.lua adds to a dead-lettered entry
// (docs/wire-format.md), and those that Replay adds to a replayed job.
const (
	FieldDeadReason   = "dead_reason"
	FieldDeadError    = "dead_error"
	FieldDeadAt       = "dead_at"
	FieldDeadAttempts = "dead_attempts"
	FieldDeadConsumer = "dead_consumer"
	FieldDeadEntryID  = "dead_entry_id"
	FieldDeadStream   = "dead_stream"
	// FieldReplayedFrom is the dead-letter entry ID a replayed job came from.
	FieldReplayedFrom = stream.FieldReplayedFrom
	// FieldReplayCount counts how many times the job was replayed.
	FieldReplayCount = stream.FieldReplayCount
)

// Errors returned by this package; check them with errors.Is.
var (
	// ErrReplayActive is returned by Replay when another replay of the same
	// dead-letter stream holds the lease.
	ErrReplayActive = errors.New("dlq: another replay of this dead-letter stream is active")
	// ErrLeaseLost is returned by Replay when its lease expired or was taken
	// while it ran; it stopped before the next entry.
	ErrLeaseLost = errors.New("dlq: replay lease lost")
	// ErrNotFound is returned by Get for an ID that is not in the
	// dead-letter stream.
	ErrNotFound = errors.New("dlq: entry not found")
)

// Config configures a [DLQ]. The zero value is valid.
type Config struct {
	// CursorTTL is how long an interrupted replay's cursor (see [DLQ.Replay])
	// is kept after its last write. Defaults to [DefaultCursorTTL].
	CursorTTL time.Duration
	// DeadLetterStream is the dead-letter stream. It must hash to the source
	// stream's cluster slot. Defaults to stream.KeysFor(source).Dead, the
	// consumer's default.
	DeadLetterStream string
	// LeaseTTL is how long a replay's lease lives without renewal; a replay
	// renews it every LeaseTTL/3. After a crash, a new replay can start once
	// it has expired. Defaults to [DefaultLeaseTTL].
	LeaseTTL time.Duration
	// PageSize is how many entries one XRANGE reads. Defaults to
	// [DefaultPageSize].
	PageSize int
}

// DLQ operates the dead-letter stream of one source stream. It is safe for
// concurrent use.
type DLQ struct {
	rdb    redis.UniversalClient
	source string
	dead   string
	lease  string
	cursor string
	cfg    Config
}

// New returns the DLQ of sourceStream. It fails if a name is invalid or the
// dead-letter stream is in another cluster slot than the source.
func New(rdb redis.UniversalClient, sourceStream string, cfg Config) (*DLQ, error) {
	bad := func(format string, args ...any) (*DLQ, error) {
		return nil, fmt.Errorf("dlq: "+format, args...)
	}
	if rdb == nil {
		return bad("nil Redis client")
	}
	keys, err := stream.KeysFor(sourceStream)
	if err != nil {
		return nil, fmt.Errorf("dlq: source stream: %w", err)
	}
	if cfg.DeadLetterStream == "" {
		cfg.DeadLetterStream = keys.Dead
	}
	if cfg.DeadLetterStream == sourceStream {
		return bad("Config.DeadLetterStream (%q) must differ from the source stream", cfg.DeadLetterStream)
	}
	if keyslot.Of(cfg.DeadLetterStream) != keyslot.Of(sourceStream) {
		return bad("Config.DeadLetterStream (%q) must hash to the cluster slot of the source stream (%q); use a name with the same hash tag, such as %q",
			cfg.DeadLetterStream, sourceStream, keys.Dead)
	}
	switch {
	case cfg.CursorTTL < 0:
		return bad("Config.CursorTTL (%v) must not be negative", cfg.CursorTTL)
	case cfg.LeaseTTL < 0:
		return bad("Config.LeaseTTL (%v) must not be negative", cfg.LeaseTTL)
	case cfg.LeaseTTL > 0 && cfg.LeaseTTL < 30*time.Millisecond:
		return bad("Config.LeaseTTL (%v) must be at least 30ms", cfg.LeaseTTL)
	case cfg.PageSize < 0:
		return bad("Config.PageSize (%d) must not be negative", cfg.PageSize)
	}
	if cfg.CursorTTL == 0 {
		cfg.CursorTTL = DefaultCursorTTL
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	lease, err := stream.DerivedKey(cfg.DeadLetterStream, "replay")
	if err != nil {
		return nil, fmt.Errorf("dlq: dead-letter stream: %w", err)
	}
	cursor, _ := stream.DerivedKey(cfg.DeadLetterStream, "replay:cursor")
	return &DLQ{rdb: rdb, source: sourceStream, dead: cfg.DeadLetterStream, lease: lease, cursor: cursor, cfg: cfg}, nil
}

// Source returns the source stream, where Replay puts jobs back.
func (d *DLQ) Source() string { return d.source }

// Stream returns the dead-letter stream.
func (d *DLQ) Stream() string { return d.dead }

// Keys returns the keys the DLQ uses besides the two streams: the replay
// lease and the replay cursor.
func (d *DLQ) Keys() (lease, cursor string) { return d.lease, d.cursor }

// Field is one field of a stream entry, as stored.
type Field struct {
	Name, Value string
}

// Entry is one entry of the dead-letter stream.
type Entry struct {
	// ID is the dead-letter entry's ID.
	ID string
	// Stream is the dead-letter stream the entry was read from (for a
	// partitioned queue, see [Partitioned], its partition's).
	Stream string
	// Fields are the entry's raw fields in order, dead_* fields included,
	// duplicates kept.
	Fields []Field
	// Job is the dead job decoded without its dead_* fields, as the source
	// stream held it (its ID and EntryID refer to the source entry), or nil
	// if it does not decode (a malformed job); DecodeErr then says why.
	Job *stream.Job
	// DecodeErr is the decode error when Job is nil.
	DecodeErr error
	// Reason is dead_reason: malformed, unknown_type, crashed, panic,
	// exhausted or permanent.
	Reason string
	// Error is dead_error.
	Error string
	// DeadAt is dead_at; when absent or invalid, the time of ID.
	DeadAt time.Time
	// Attempts is dead_attempts (0 when absent or invalid).
	Attempts int
	// Consumer is dead_consumer.
	Consumer string
	// SourceEntryID is dead_entry_id, the job's entry ID in the source stream.
	SourceEntryID string
	// SourceStream is dead_stream.
	SourceStream string
}

// Value returns the last value of the field name (what stream.Decode
// sees), and whether the entry has it.
func (e *Entry) Value(name string) (string, bool) {
	for i := len(e.Fields) - 1; i >= 0; i-- {
		if e.Fields[i].Name == name {
			return e.Fields[i].Value, true
		}
	}
	return "", false
}

// Type returns the job's type field, raw ("" when absent).
func (e *Entry) Type() string {
	v, _ := e.Value(stream.FieldType)
	return v
}

// newEntry parses a dead-letter entry.
func newEntry(key, id string, fields []Field) Entry {
	e := Entry{ID: id, Stream: key, Fields: fields}
	job := make(map[string]any, len(fields))
	for _, f := range fields {
		switch f.Name {
		case FieldDeadReason:
			e.Reason = f.Value
		case FieldDeadError:
			e.Error = f.Value
		case FieldDeadAt:
			if ms, err := strconv.ParseInt(f.Value, 10, 64); err == nil && ms >= 0 {
				e.DeadAt = time.UnixMilli(ms)
			}
		case FieldDeadAttempts:
			e.Attempts, _ = strconv.Atoi(f.Value)
		case FieldDeadConsumer:
			e.Consumer = f.Value
		case FieldDeadEntryID:
			e.SourceEntryID = f.Value
		case FieldDeadStream:
			e.SourceStream = f.Value
		default:
			if !strings.HasPrefix(f.Name, "dead_") {
				job[f.Name] = f.Value
			}
		}
	}
	if e.DeadAt.IsZero() {
		e.DeadAt, _ = stream.EntryTime(id)
	}
	srcID := e.SourceEntryID
	if _, ok := stream.EntryTime(srcID); !ok {
		srcID = id
	}
	e.Job, e.DecodeErr = stream.Decode(srcID, job)
	if e.DecodeErr != nil {
		e.Job = nil
	} else {
		e.Job.Stream = e.SourceStream
	}
	return e
}

// doer runs any command.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// xrange reads entries of key from start to end (XRANGE syntax, "(" for
// exclusive), at most count, with their raw fields in order.
func xrange(ctx context.Context, rdb doer, key, start, end string, count int) ([]Entry, error) {
	res, err := rdb.Do(ctx, "XRANGE", key, start, end, "COUNT", count).Slice()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, err
	}
	return parseEntries(key, res)
}

// parseEntries parses an XRANGE reply of stream key.
func parseEntries(key string, res []any) ([]Entry, error) {
	out := make([]Entry, 0, len(res))
	for _, r := range res {
		pair, ok := r.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("dlq: unexpected XRANGE reply element %T", r)
		}
		id, ok := pair[0].(string)
		if !ok {
			return nil, fmt.Errorf("dlq: unexpected XRANGE entry ID %T", pair[0])
		}
		var fields []Field
		switch fv := pair[1].(type) {
		case []any:
			fields = make([]Field, 0, len(fv)/2)
			for i := 0; i+1 < len(fv); i += 2 {
				fields = append(fields, Field{Name: str(fv[i]), Value: str(fv[i+1])})
			}
		case map[any]any: // RESP3 servers may answer with a map (order lost)
			for k, v := range fv {
				fields = append(fields, Field{Name: str(k), Value: str(v)})
			}
		case nil:
		default:
			return nil, fmt.Errorf("dlq: unexpected XRANGE fields %T", pair[1])
		}
		out = append(out, newEntry(key, id, fields))
	}
	return out, nil
}

func str(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	case nil:
		return ""
	default:
		return fmt.Sprint(s)
	}
}

// List returns up to limit entries matching f (limit 0 means
// [DefaultListLimit]), oldest first, starting after the entry ID after (""
// for the beginning). next is the ID to pass as after for the following
// page, or "" when there are no more entries.
func (d *DLQ) List(ctx context.Context, f Filter, limit int, after string) (entries []Entry, next string, err error) {
	if limit <= 0 {
		limit = DefaultListLimit
	}
	start := "-"
	if after != "" {
		if _, err := stream.ParseID(after); err != nil {
			return nil, "", fmt.Errorf("dlq: List: after: %w", err)
		}
		start = "(" + after
	}
	last := ""
	err = d.scan(ctx, f, start, "+", func(e Entry, matched bool) (bool, error) {
		if matched {
			if len(entries) == limit {
				next = last
				return false, nil
			}
			entries = append(entries, e)
			last = e.ID
		}
		return true, nil
	})
	if err != nil {
		return nil, "", err
	}
	return entries, next, nil
}

// Get returns the entry with the given ID, or an error wrapping
// [ErrNotFound].
func (d *DLQ) Get(ctx context.Context, id string) (Entry, error) {
	if _, err := stream.ParseID(id); err != nil {
		return Entry{}, fmt.Errorf("dlq: Get: %w", err)
	}
	es, err := xrange(ctx, d.rdb, d.dead, id, id, 1)
	if err != nil {
		return Entry{}, fmt.Errorf("dlq: Get %s: %w", id, err)
	}
	if len(es) == 0 {
		return Entry{}, fmt.Errorf("%w: %s in %s", ErrNotFound, id, d.dead)
	}
	return es[0], nil
}

// Count returns how many entries match f. The zero Filter counts with XLEN;
// any other reads the whole stream.
func (d *DLQ) Count(ctx context.Context, f Filter) (int, error) {
	if f.isZero() {
		n, err := d.rdb.XLen(ctx, d.dead).Result()
		if err != nil {
			return 0, fmt.Errorf("dlq: Count: %w", err)
		}
		return int(n), nil
	}
	n := 0
	err := d.scan(ctx, f, "-", "+", func(_ Entry, matched bool) (bool, error) {
		if matched {
			n++
		}
		return true, nil
	})
	return n, err
}

// scan calls fn for every entry from start to end (XRANGE bounds), oldest
// first, with whether it matches f, until fn returns false or an error. With
// f.IDs it reads only those IDs.
func (d *DLQ) scan(ctx context.Context, f Filter, start, end string, fn func(e Entry, matched bool) (bool, error)) error {
	m, err := f.compile()
	if err != nil {
		return err
	}
	if m.ids != nil {
		return d.scanIDs(ctx, m, start, end, fn)
	}
	for {
		page, err := xrange(ctx, d.rdb, d.dead, start, end, d.cfg.PageSize)
		if err != nil {
			return fmt.Errorf("dlq: XRANGE %s: %w", d.dead, err)
		}
		for _, e := range page {
			more, err := fn(e, m.match(&e))
			if err != nil || !more {
				return err
			}
		}
		if len(page) < d.cfg.PageSize {
			return nil
		}
		start = "(" + page[len(page)-1].ID
	}
}

func (d *DLQ) scanIDs(ctx context.Context, m *matcher, start, end string, fn func(e Entry, matched bool) (bool, error)) error {
	lo, hi := stream.ID{}, stream.ID{Ms: ^uint64(0), Seq: ^uint64(0)}
	loOpen := false
	if s, ok := strings.CutPrefix(start, "("); ok {
		lo, _ = stream.ParseID(s)
		loOpen = true
	} else if start != "-" {
		lo, _ = stream.ParseID(start)
	}
	if end != "+" {
		hi, _ = stream.ParseID(end)
	}
	var ids []string
	for _, id := range m.ids {
		p, _ := stream.ParseID(id)
		if p.Compare(lo) < 0 || (loOpen && p == lo) || hi.Compare(p) < 0 {
			continue
		}
		ids = append(ids, id)
	}
	for len(ids) > 0 {
		batch := ids[:min(len(ids), d.cfg.PageSize)]
		ids = ids[len(batch):]
		cmds, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range batch {
				p.Do(ctx, "XRANGE", d.dead, id, id)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("dlq: XRANGE %s: %w", d.dead, err)
		}
		for _, c := range cmds {
			res, err := c.(*redis.Cmd).Slice()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("dlq: XRANGE %s: %w", d.dead, err)
			}
			es, err := parseEntries(d.dead, res)
			if err != nil {
				return err
			}
			for _, e := range es {
				more, err := fn(e, m.match(&e))
				if err != nil || !more {
					return err
				}
			}
		}
	}
	return nil
}

// lastID returns the ID of the dead-letter stream's newest entry, or "" if
// it is empty.
func (d *DLQ) lastID(ctx context.Context) (string, error) {
	res, err := d.rdb.Do(ctx, "XREVRANGE", d.dead, "+", "-", "COUNT", 1).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", err
	}
	es, err := parseEntries(d.dead, res)
	if err != nil || len(es) == 0 {
		return "", err
	}
	return es[0].ID, nil
}
