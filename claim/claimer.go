package claim

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

var (
	//go:embed reclaim.lua
	reclaimLua string
	//go:embed readown.lua
	readOwnLua string
	//go:embed touch.lua
	touchLua string
	//go:embed reap.lua
	reapLua string
	//go:embed oversize.lua
	oversizeLua string

	// The scripts that hand entries over cut an oversize one short with
	// the helpers of oversize.lua, put in front.
	reclaimScript = redis.NewScript(oversizeLua + reclaimLua)
	readOwnScript = redis.NewScript(oversizeLua + readOwnLua)
	touchScript   = redis.NewScript(touchLua)
	reapScript    = redis.NewScript(reapLua)
)

// MaxCallsPerSweep bounds the XAUTOCLAIM calls of one [Claimer.Sweep], so a
// long pending-entries list is covered over several sweeps instead of one
// unbounded loop.
const MaxCallsPerSweep = 64

// Entry is a pending entry that a consumer now owns.
type Entry struct {
	// ID is the stream entry ID.
	ID string
	// Fields are the entry's field names and values as Redis holds them:
	// name, value, name, value ..., in the entry's order, a name given
	// twice kept twice; nil for an entry deleted while pending. With a
	// size limit ([Oversize].MaxBytes), an entry whose names and values
	// add up to more than the limit, but which is within it as
	// [stream.DecodeFields] counts it (each name once, with its last
	// value), comes with one value per name, its last, in the order of
	// those last values: what decoding reads, without the earlier values
	// of names given again that would make it larger than the limit.
	Fields []string
	// Deliveries is the entry's delivery count, this delivery included.
	Deliveries int
	// Cut is set for an entry over the Claimer's size limit
	// ([Oversize].MaxBytes): Redis sent it cut short, and Fields holds what
	// its dead letter records of it.
	Cut *Cut
}

// Cut describes an entry over the size limit that a [Claimer] handed over
// cut short: a reply never carries such an entry whole, so that a reply
// slower than the client's ReadTimeout cannot fail every reclaim of it and
// of the entries claimed with it.
type Cut struct {
	// Size is the entry's size in bytes as [stream.DecodeFields] counts it
	// (each name once, with its last value).
	Size int
	// Field is the name of its longest value, cut to [Oversize].KeepBytes,
	// as [stream.OversizeError] reports it (with KeepBytes
	// [stream.CutBytes]).
	Field string
	// Left is how many of its fields Fields leaves out (it has more than
	// [Oversize].KeepFields).
	Left int
}

// Oversize says which entries a [Claimer] hands over cut short, and how:
// every field in order when there are at most KeepFields, else one per
// name (its last value) for the first KeepFields names in the order they
// first come; each name and value cut to KeepBytes. (The consumer records
// an oversize entry's dead letter so: docs/wire-format.md.)
type Oversize struct {
	// MaxBytes is the size limit; 0 hands every entry over whole, with no
	// budget. It is also the reply's budget: a reclaim or re-read takes
	// entries until the bytes of the names and values it hands over (as
	// handed over: whole, one value per name, or cut) add up to MaxBytes
	// (or it has count), so that a reply carries
	// less than MaxBytes plus one entry; the next call (the rest of the
	// sweep, the next ReadOwn) takes the others, which were not touched.
	// That one entry is within MaxBytes as handed over (see
	// [Entry.Fields]), except a cut entry, which holds up to KeepFields
	// names and values of KeepBytes each, whatever MaxBytes is.
	MaxBytes int
	// KeepFields and KeepBytes say what is kept of an entry over it.
	// KeepFields 0 keeps no fields, only its Cut; KeepBytes 0 keeps up to
	// KeepFields fields, each name and value empty (and Cut.Field empty).
	// The consumer keeps 1,100 fields and [stream.CutBytes] bytes, as its
	// dead letters do.
	KeepFields, KeepBytes int
}

// Field returns the value of the entry's field name (the last one, for a
// name given twice), or "" when it has none.
func (e Entry) Field(name string) string { return stream.Field(e.Fields, name) }

// Claimer acts for one consumer of one group on one stream. It is safe for
// concurrent use, except that Sweep must not run concurrently with itself.
type Claimer struct {
	rdb                     redis.Scripter
	stream, group, consumer string
	over                    Oversize
	cursor                  string
}

// New returns a Claimer for consumer in group on stream, which hands
// entries over the size limit of over over cut short.
func New(rdb redis.Scripter, stream, group, consumer string, over Oversize) *Claimer {
	return &Claimer{rdb: rdb, stream: stream, group: group, consumer: consumer, over: over, cursor: "0-0"}
}

// Sweep takes over entries idle for at least minIdle. Before each XAUTOCLAIM
// it asks take how many entries it may claim (the free worker slots; take
// reserves them), and stops when take returns 0, when the cursor reaches the
// end of the pending-entries list, or after [MaxCallsPerSweep] calls; the
// next Sweep continues where this one stopped (from the start of the list
// after reaching its end). Every reply goes to handle with the
// number of slots that were reserved for it (the caller releases those left
// unused), the entries claimed, and the IDs found deleted.
func (c *Claimer) Sweep(ctx context.Context, minIdle time.Duration, take func(max int) int, handle func(reserved int, claimed []Entry, deleted []string)) error {
	const max = 1000
	for i := 0; i < MaxCallsPerSweep; i++ {
		n := take(max)
		if n <= 0 {
			return nil
		}
		next, claimed, deleted, err := c.reclaim(ctx, minIdle, c.cursor, n)
		if err != nil {
			handle(n, nil, nil)
			return err
		}
		c.cursor = next
		handle(n, claimed, deleted)
		if next == "0-0" {
			return nil
		}
	}
	return nil
}

func (c *Claimer) reclaim(ctx context.Context, minIdle time.Duration, cursor string, count int) (string, []Entry, []string, error) {
	res, err := reclaimScript.Run(ctx, c.rdb, []string{c.stream}, c.group, c.consumer, minIdle.Milliseconds(), cursor, count,
		c.over.MaxBytes, c.over.KeepFields, c.over.KeepBytes).Slice()
	if err != nil {
		return "", nil, nil, fmt.Errorf("claim: XAUTOCLAIM %s/%s: %w", c.stream, c.group, err)
	}
	if len(res) != 3 {
		return "", nil, nil, fmt.Errorf("claim: XAUTOCLAIM %s/%s: unexpected reply %v", c.stream, c.group, res)
	}
	next, _ := res[0].(string)
	entries, err := parseEntries(res[1])
	if err != nil {
		return "", nil, nil, err
	}
	return next, entries, strings(res[2]), nil
}

// ReadOwn re-reads up to count of this consumer's own pending entries with
// IDs greater than after ("0" for the first page), for a consumer that
// restarted under the same name. Reading counts as a delivery. Entries
// deleted while pending are acknowledged and returned as deleted, and count
// toward count: the entries and deleted IDs of one call add up to at most
// count, and the next page goes on after the highest ID of either.
func (c *Claimer) ReadOwn(ctx context.Context, after string, count int) ([]Entry, []string, error) {
	res, err := readOwnScript.Run(ctx, c.rdb, []string{c.stream}, c.group, c.consumer, after, count,
		c.over.MaxBytes, c.over.KeepFields, c.over.KeepBytes).Slice()
	if err != nil {
		return nil, nil, fmt.Errorf("claim: read own pending %s/%s: %w", c.stream, c.group, err)
	}
	if len(res) != 2 {
		return nil, nil, fmt.Errorf("claim: read own pending %s/%s: unexpected reply %v", c.stream, c.group, res)
	}
	entries, err := parseEntries(res[0])
	return entries, strings(res[1]), err
}

// Extend resets the idle time of the entries this consumer still owns (the
// heartbeat of running jobs) without changing their delivery counts, and
// returns the IDs it no longer owns: another consumer reclaimed them, so
// their handlers should stop.
func (c *Claimer) Extend(ctx context.Context, ids ...string) ([]string, error) {
	return c.touch(ctx, 0, ids)
}

// Release gives entries this consumer owns but will not finish back to the
// group: their idle time is set to idle (the visibility timeout), so the
// next sweep of any consumer takes them at once, and their delivery count is
// lowered by one, so that after that reclaim it is what it was: a job given
// back unfinished does not count as delivered twice. It returns the IDs it
// no longer owned.
func (c *Claimer) Release(ctx context.Context, idle time.Duration, ids ...string) ([]string, error) {
	return c.touch(ctx, idle, ids)
}

func (c *Claimer) touch(ctx context.Context, idle time.Duration, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, c.group, c.consumer, idle.Milliseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := touchScript.Run(ctx, c.rdb, []string{c.stream}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("claim: touch %d entries of %s/%s: %w", len(ids), c.stream, c.group, err)
	}
	return strings(res), nil
}

// Reap deletes the group's consumers, other than this one, that have been
// idle for at least minIdle and own no pending entry, and returns their
// names. A consumer with pending entries is never deleted, since Redis would
// drop its entries with it; the check and the delete are one script.
func (c *Claimer) Reap(ctx context.Context, minIdle time.Duration) ([]string, error) {
	res, err := reapScript.Run(ctx, c.rdb, []string{c.stream}, c.group, minIdle.Milliseconds(), c.consumer).Slice()
	if err != nil {
		return nil, fmt.Errorf("claim: reap consumers of %s/%s: %w", c.stream, c.group, err)
	}
	return strings(res), nil
}

func parseEntries(v any) ([]Entry, error) {
	list, _ := v.([]any)
	out := make([]Entry, 0, len(list))
	for _, x := range list {
		e, ok := x.([]any)
		if !ok || (len(e) != 3 && len(e) != 6) {
			return nil, fmt.Errorf("claim: unexpected entry %v", x)
		}
		id, _ := e[0].(string)
		n, _ := e[2].(int64)
		var fields []string
		if flat, ok := e[1].([]any); ok {
			fields = make([]string, len(flat))
			for i, f := range flat {
				s, ok := f.(string) // Redis sends bulk strings
				if !ok {
					s = fmt.Sprint(f)
				}
				fields[i] = s
			}
		}
		en := Entry{ID: id, Fields: fields, Deliveries: int(n)}
		if len(e) == 6 {
			size, _ := e[3].(int64)
			field, _ := e[4].(string)
			left, _ := e[5].(int64)
			en.Cut = &Cut{Size: int(size), Field: field, Left: int(left)}
		}
		out = append(out, en)
	}
	return out, nil
}

func strings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
