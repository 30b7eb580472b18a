package consumer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The raw read: a reader of its own connection sends XREADGROUP through
// go-redis's DoRaw and parses the reply itself (parseXRead), instead of
// go-redis's typed XReadGroup, which allocates a string per field name and
// value and a map per entry. Each entry here costs one string (the entry's
// bytes, which its id, names and values share) and the slice of its names
// and values. DoRaw carries only the client's ReadTimeout (go-redis gives
// a typed blocking command BLOCK plus 10 s), so a read blocks raw only when
// the ReadTimeout leaves room for BLOCK (blockingReader.rawBlocks, as with
// the defaults); otherwise only the reads while a backlog is there go raw,
// without BLOCK, and the blocking read stays typed (its reply converted,
// see readOf).

// An entry is a stream entry as a read returned it: its ID, and its fields'
// names and values in Redis's order (name, value, name, value ...); nil for
// an entry deleted while pending. stream.DecodeFields decodes them.
type entry struct {
	id     string
	fields []string
}

// A streamRead is what a read returned of one stream.
type streamRead struct {
	stream  string
	entries []entry
}

// readOf converts a typed XREADGROUP reply (nil for none).
func readOf(res []redis.XStream) []streamRead {
	if len(res) == 0 {
		return nil
	}
	out := make([]streamRead, len(res))
	for i, x := range res {
		out[i] = streamRead{stream: x.Stream, entries: make([]entry, len(x.Messages))}
		for j, m := range x.Messages {
			out[i].entries[j] = entry{id: m.ID, fields: pairsOf(m.Values)}
		}
	}
	return out
}

// pairsOf returns the names and values of fields as an entry holds them (in
// name order; a value that is not a string in its fmt form; nil for nil).
func pairsOf(fields map[string]any) []string {
	if fields == nil {
		return nil
	}
	out := make([]string, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v, ok := fields[k].(string)
		if !ok {
			v = fmt.Sprint(fields[k])
		}
		out = append(out, k, v)
	}
	return out
}

// hasField reports whether fields (names and values, as in an entry) has
// the name.
func hasField(fields []string, name string) bool {
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == name {
			return true
		}
	}
	return false
}

// replyError is an error reply of Redis (NOGROUP, ...) met in a raw reply;
// like go-redis's own, it is a [redis.Error], so the reader keeps its
// connection and the read loop recognises NOGROUP.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a [redis.Error].
func (replyError) RedisError() {}

var _ redis.Error = replyError("")

var errBadReply = errors.New("consumer: malformed XREADGROUP reply")

// respParser reads one RESP2 or RESP3 reply from b; it never panics and
// never reads past b.
type respParser struct {
	b   []byte
	pos int
}

// header reads a type byte and the line after it.
func (p *respParser) header() (byte, []byte, error) {
	if p.pos >= len(p.b) {
		return 0, nil, errBadReply
	}
	t := p.b[p.pos]
	for i := p.pos + 1; i+1 < len(p.b); i++ {
		if p.b[i] == '\r' && p.b[i+1] == '\n' {
			line := p.b[p.pos+1 : i]
			p.pos = i + 2
			return t, line, nil
		}
	}
	return 0, nil, errBadReply
}

// length parses a RESP length: -1 (a RESP2 nil) or 0 and above.
func length(line []byte) (int, error) {
	if len(line) == 2 && line[0] == '-' && line[1] == '1' {
		return -1, nil
	}
	if len(line) == 0 || len(line) > 10 {
		return 0, errBadReply
	}
	n := 0
	for _, c := range line {
		if c < '0' || c > '9' {
			return 0, errBadReply
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// aggregate reads an array (or, where map is true, also a RESP3 map) header
// and returns its element count, -1 for a nil.
func (p *respParser) aggregate(allowMap bool) (int, error) {
	t, line, err := p.header()
	if err != nil {
		return 0, err
	}
	switch t {
	case '_':
		return -1, nil
	case '*':
		return length(line)
	case '%':
		if allowMap {
			n, err := length(line)
			if n < 0 || err != nil || n > len(p.b) {
				return 0, errBadReply
			}
			return 2 * n, nil
		}
	case '-':
		return 0, replyError(line)
	}
	return 0, errBadReply
}

// blob reads a bulk, verbatim or simple string and returns its bounds in b.
func (p *respParser) blob() (int, int, error) {
	t, line, err := p.header()
	if err != nil {
		return 0, 0, err
	}
	switch t {
	case '+':
		end := p.pos - 2
		return end - len(line), end, nil
	case '$', '=':
		n, err := length(line)
		if err != nil || n < 0 || n > len(p.b)-p.pos-2 {
			return 0, 0, errBadReply
		}
		start, end := p.pos, p.pos+n
		if p.b[end] != '\r' || p.b[end+1] != '\n' {
			return 0, 0, errBadReply
		}
		p.pos = end + 2
		if t == '=' { // "txt:" or "mkd:" first
			if n < 4 {
				return 0, 0, errBadReply
			}
			start += 4
		}
		return start, end, nil
	}
	return 0, 0, errBadReply
}

// skip reads one integer, the delivery metadata a 4-element entry carries.
func (p *respParser) skip() error {
	t, _, err := p.header()
	if err != nil || t != ':' {
		return errBadReply
	}
	return nil
}

// parseXRead parses the raw reply of an XREADGROUP, RESP2 (an array of
// [stream, entries]) or RESP3 (a map of stream to entries), as go-redis's
// XReadGroup reads it: redis.Nil for no entries, an entry deleted while
// pending with nil fields. An error reply is a [replyError]; any
// other unexpected shape is errBadReply, as go-redis fails on one.
func parseXRead(b []byte) ([]streamRead, error) {
	p := &respParser{b: b}
	n, err := p.aggregate(true)
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, redis.Nil
	}
	resp3 := b[0] == '%'
	streams := n
	if resp3 {
		streams = n / 2
	}
	if streams > len(b) {
		return nil, errBadReply
	}
	res := make([]streamRead, 0, streams)
	var offs []int // scratch: bounds of one entry's names and values
	for range streams {
		if !resp3 {
			if m, err := p.aggregate(false); err != nil || m != 2 {
				return nil, errBadReply
			}
		}
		s0, s1, err := p.blob()
		if err != nil {
			return nil, errBadReply
		}
		m, err := p.aggregate(false)
		if err != nil || m < 0 || m > len(b) {
			return nil, errBadReply
		}
		x := streamRead{stream: string(b[s0:s1]), entries: make([]entry, 0, m)}
		for range m {
			var e entry
			if e, offs, err = p.entry(offs); err != nil {
				return nil, err
			}
			x.entries = append(x.entries, e)
		}
		res = append(res, x)
	}
	if p.pos != len(b) {
		return nil, errBadReply
	}
	return res, nil
}

// entry reads one [id, fields] (or [id, fields, idle, deliveries]) entry.
func (p *respParser) entry(offs []int) (entry, []int, error) {
	k, err := p.aggregate(false)
	if err != nil || (k != 2 && k != 4) {
		return entry{}, offs, errBadReply
	}
	i0, i1, err := p.blob()
	if err != nil {
		return entry{}, offs, errBadReply
	}
	f, err := p.aggregate(true)
	if err != nil || (f > 0 && f%2 != 0) || f > len(p.b) {
		return entry{}, offs, errBadReply
	}
	offs = offs[:0]
	for range max(f, 0) {
		a, b, err := p.blob()
		if err != nil {
			return entry{}, offs, errBadReply
		}
		offs = append(offs, a, b)
	}
	end := p.pos
	if k == 4 {
		if p.skip() != nil || p.skip() != nil {
			return entry{}, offs, errBadReply
		}
	}
	// One string for the entry; its id, names and values share it.
	s := string(p.b[i0:end])
	e := entry{id: s[:i1-i0]}
	if f < 0 {
		return e, offs, nil // deleted while pending
	}
	e.fields = make([]string, f)
	for j := 0; j < len(offs); j += 2 {
		e.fields[j/2] = s[offs[j]-i0 : offs[j+1]-i0]
	}
	return e, offs, nil
}

// rawArgs returns the arguments of a's XREADGROUP (BLOCK in whole
// milliseconds, at least 1: BLOCK 0 would wait forever).
func rawArgs(a *redis.XReadGroupArgs) []any {
	args := make([]any, 0, 7+len(a.Streams))
	args = append(args, "xreadgroup", "group", a.Group, a.Consumer)
	if a.Count > 0 {
		args = append(args, "count", strconv.FormatInt(a.Count, 10))
	}
	if a.Block >= 0 {
		args = append(args, "block", strconv.FormatInt(max(a.Block.Milliseconds(), 1), 10))
	}
	args = append(args, "streams")
	for _, s := range a.Streams {
		args = append(args, s)
	}
	return args
}
