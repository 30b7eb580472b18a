package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// The tests in this file check docs/wire-format.md against package stream and
// a real Redis: the snippets under docs/snippets run as written, and what they
// write decodes as the doc says.

const (
	wireDoc      = "../docs/wire-format.md"
	wireSnippets = "../docs/snippets"
	wireDepsHint = "run scripts/test-deps.sh to install the snippets' dependencies"
)

// wireRedis returns a client of the Redis at $REDIS_ADDR (default
// 127.0.0.1:6379), closed when t ends. It fails t if Redis is unreachable.
func wireRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s is unreachable (set REDIS_ADDR to the host:port of a Redis server): %v", addr, err)
	}
	return rdb, addr
}

// wireStream returns a stream name of t's own and deletes the key when t ends.
func wireStream(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	name := "pelican-test:" + t.Name() + ":" + uuid.NewString()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rdb.Del(ctx, name).Err(); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	})
	return name
}

// wireXAdd adds an entry of raw field/value pairs, as a non-Go producer would,
// and returns it as XRANGE reads it back.
func wireXAdd(t *testing.T, rdb *redis.Client, key string, fields ...any) redis.XMessage {
	t.Helper()
	id, err := rdb.Do(t.Context(), append([]any{"XADD", key, "*"}, fields...)...).Text()
	if err != nil {
		t.Fatalf("XADD: %v", err)
	}
	msgs, err := rdb.XRange(t.Context(), key, id, id).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("XRANGE %s %s: %d entries, %v", key, id, len(msgs), err)
	}
	return msgs[0]
}

func wireCheck[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

func wireFieldNames(m redis.XMessage) []string {
	return slices.Sorted(maps.Keys(m.Values))
}

func wireDecode(t *testing.T, m redis.XMessage) *stream.Job {
	t.Helper()
	job, err := stream.Decode(m.ID, m.Values)
	if err != nil {
		t.Fatalf("Decode(%s %v): %v", m.ID, m.Values, err)
	}
	wireCheck(t, "EntryID", job.EntryID, m.ID)
	return job
}

var wireTraceParent = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)

func TestWireFormat_Snippets(t *testing.T) {
	t.Parallel()
	rdb, addr := wireRedis(t)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("REDIS_ADDR %q is not host:port: %v", addr, err)
	}

	needCommand := func(t *testing.T, name string) string {
		t.Helper()
		path, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s is not installed (%v): %s", name, err, wireDepsHint)
		}
		return path
	}
	tests := []struct {
		name string
		file string
		// command checks the snippet's dependencies and returns the command
		// that runs it, from wireSnippets.
		command func(t *testing.T) []string
	}{
		{"redis-cli", "enqueue.sh", func(t *testing.T) []string {
			needCommand(t, "redis-cli")
			return []string{needCommand(t, "bash"), "enqueue.sh"}
		}},
		{"python", "enqueue.py", func(t *testing.T) []string {
			// The Python on PATH may be one without redis-py; the snippet
			// runs with Debian's, where scripts/test-deps.sh installs it.
			const python = "/usr/bin/python3"
			if out, err := exec.Command(python, "-c", "import redis").CombinedOutput(); err != nil {
				lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
				t.Fatalf("%s cannot import redis-py (%v: %s): %s", python, err, lines[len(lines)-1], wireDepsHint)
			}
			return []string{python, "enqueue.py"}
		}},
		{"node", "enqueue.js", func(t *testing.T) []string {
			node := needCommand(t, "node")
			if _, err := os.Stat(filepath.Join(wireSnippets, "node_modules", "ioredis", "package.json")); err != nil {
				t.Fatalf("ioredis is not installed in docs/snippets/node_modules (%v): %s", err, wireDepsHint)
			}
			return []string{node, "enqueue.js"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := wireStream(t, rdb)
			argv := tt.command(t)

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir = wireSnippets
			cmd.Env = append(os.Environ(), "REDIS_HOST="+host, "REDIS_PORT="+port, "PELICAN_STREAM="+key)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), err, &stdout, &stderr)
			}
			end := time.Now()

			msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
			if err != nil {
				t.Fatalf("XRANGE: %v", err)
			}
			var ids []string
			for _, m := range msgs {
				ids = append(ids, m.ID)
			}
			if printed := strings.Fields(stdout.String()); !slices.Equal(printed, ids) || len(ids) != 2 {
				t.Fatalf("the snippet printed entry IDs %q, the stream holds %q; want the same two", printed, ids)
			}
			t.Run("smallest", func(t *testing.T) { wireCheckSmallest(t, msgs[0]) })
			t.Run("full", func(t *testing.T) { wireCheckFull(t, msgs[1], start, end) })
		})
	}
}

// wireCheckSmallest checks job (a) of a snippet: type and payload only, every
// other field at its default.
func wireCheckSmallest(t *testing.T, m redis.XMessage) {
	if got, want := wireFieldNames(m), []string{"payload", "type"}; !slices.Equal(got, want) {
		t.Errorf("fields %q, want %q", got, want)
	}
	job := wireDecode(t, m)
	entryTime, ok := stream.EntryTime(m.ID)
	if !ok {
		t.Fatalf("EntryTime(%q) failed", m.ID)
	}
	wireCheck(t, "Type", job.Type, "email.send")
	wireCheck(t, "ID (default: entry ID)", job.ID, m.ID)
	wireCheck(t, "CreatedAt (default: entry time)", job.CreatedAt.UnixMilli(), entryTime.UnixMilli())
	wireCheck(t, "ContentType (default)", job.ContentType, stream.ContentTypeJSON)
	wireCheck(t, "Attempt (default)", job.Attempt, 0)
	wireCheck(t, "MaxAttempts (default)", job.MaxAttempts, 0)
	wireCheck(t, "IdempotencyKey", job.IdempotencyKey, "")
	wireCheck(t, "LockKey", job.LockKey, "")
	wireCheck(t, "TraceParent", job.TraceParent, "")
	wireCheck(t, "TraceState", job.TraceState, "")
	wireCheck(t, "LastError", job.LastError, "")
	wireCheck(t, "len(Headers)", len(job.Headers), 0)
	wireCheck(t, "len(Extra)", len(job.Extra), 0)

	var p struct {
		To string `json:"to"`
	}
	if err := job.Decode(&p); err != nil {
		t.Fatalf("job.Decode: %v", err)
	}
	wireCheck(t, "payload.to", p.To, "a@example.com")
}

// wireCheckFull checks job (b) of a snippet, run between start and end: every
// optional field a producer writes, each where the doc says it lands.
func wireCheckFull(t *testing.T, m redis.XMessage, start, end time.Time) {
	want := []string{
		"attempt", "content_type", "created_at", "h.tenant", "idempotency_key", "job_id", "lock_key",
		"max_attempts", "origin", "payload", "traceparent", "tracestate", "type", "v",
	}
	if got := wireFieldNames(m); !slices.Equal(got, want) {
		t.Errorf("fields %q, want %q", got, want)
	}
	raw := func(name string) string {
		s, _ := m.Values[name].(string)
		return s
	}
	wireCheck(t, "field v", raw(stream.FieldVersion), "1")

	job := wireDecode(t, m)
	wireCheck(t, "Type", job.Type, "invoice.send")
	wireCheck(t, "ContentType", job.ContentType, stream.ContentTypeJSON)
	wireCheck(t, "ID", job.ID, raw(stream.FieldJobID))
	if job.ID == m.ID {
		t.Errorf("ID = the entry ID %s, want the job_id field", m.ID)
	}
	if _, err := uuid.Parse(job.ID); err != nil {
		t.Errorf("job_id %q is not a UUID: %v", job.ID, err)
	}
	wireCheck(t, "IdempotencyKey", job.IdempotencyKey, "invoice-1042-send")
	wireCheck(t, "Attempt", job.Attempt, 0)
	wireCheck(t, "MaxAttempts", job.MaxAttempts, 5)
	createdAt, err := strconv.ParseInt(raw(stream.FieldCreatedAt), 10, 64)
	if err != nil {
		t.Errorf("created_at %q: %v", raw(stream.FieldCreatedAt), err)
	}
	wireCheck(t, "CreatedAt", job.CreatedAt.UnixMilli(), createdAt)
	if createdAt < start.UnixMilli() || createdAt > end.UnixMilli() {
		t.Errorf("created_at %d is not the snippet's run time, between %d and %d", createdAt, start.UnixMilli(), end.UnixMilli())
	}
	wireCheck(t, "LockKey", job.LockKey, "invoice:1042")
	wireCheck(t, "TraceParent", job.TraceParent, raw(stream.FieldTraceParent))
	if !wireTraceParent.MatchString(job.TraceParent) {
		t.Errorf("traceparent %q is not of the W3C form 00-<32 hex>-<16 hex>-01", job.TraceParent)
	}
	wireCheck(t, "TraceState", job.TraceState, "rojo=00f067aa0ba902b7")
	wireCheck(t, "LastError", job.LastError, "")
	if want := map[string]string{"tenant": "acme"}; !maps.Equal(job.Headers, want) {
		t.Errorf("Headers = %v, want %v", job.Headers, want)
	}
	if want := map[string]string{"origin": "billing-cron"}; !maps.Equal(job.Extra, want) {
		t.Errorf("Extra = %v, want %v", job.Extra, want)
	}

	var p struct {
		InvoiceID int    `json:"invoice_id"`
		Email     string `json:"email"`
	}
	if err := job.Decode(&p); err != nil {
		t.Fatalf("job.Decode: %v", err)
	}
	wireCheck(t, "payload.invoice_id", p.InvoiceID, 1042)
	wireCheck(t, "payload.email", p.Email, "ann@example.com")
}

func TestWireFormat_RawEntries(t *testing.T) {
	t.Parallel()
	rdb, _ := wireRedis(t)

	t.Run("type only", func(t *testing.T) {
		t.Parallel()
		m := wireXAdd(t, rdb, wireStream(t, rdb), "type", "report.nightly")
		job := wireDecode(t, m)
		wireCheck(t, "Type", job.Type, "report.nightly")
		wireCheck(t, "len(Payload)", len(job.Payload), 0)
		wireCheck(t, "ID", job.ID, m.ID)
		wireCheck(t, "ContentType", job.ContentType, stream.ContentTypeJSON)
	})
	t.Run("retry written by the consumer", func(t *testing.T) {
		t.Parallel()
		const createdAt = 1767225600000 // 2026-01-01, long before the entry
		m := wireXAdd(t, rdb, wireStream(t, rdb),
			"v", "1", "type", "invoice.send", "payload", "{}", "job_id", "1795976094814-0",
			"idempotency_key", "invoice-1042-send", "attempt", "2", "max_attempts", "5",
			"created_at", strconv.Itoa(createdAt), "last_error", "smtp: 421 try again later",
			"h.tenant", "acme", "origin", "billing-cron")
		job := wireDecode(t, m)
		wireCheck(t, "ID", job.ID, "1795976094814-0")
		wireCheck(t, "Attempt", job.Attempt, 2)
		wireCheck(t, "MaxAttempts", job.MaxAttempts, 5)
		wireCheck(t, "CreatedAt", job.CreatedAt.UnixMilli(), int64(createdAt))
		wireCheck(t, "LastError", job.LastError, "smtp: 421 try again later")
		wireCheck(t, "Headers[tenant]", job.Headers["tenant"], "acme")
		wireCheck(t, "Extra[origin]", job.Extra["origin"], "billing-cron")
	})
	t.Run("16 MiB exactly", func(t *testing.T) {
		t.Parallel()
		payload := strings.Repeat("x", stream.DefaultMaxEntryBytes-len("type")-len("x")-len("payload"))
		m := wireXAdd(t, rdb, wireStream(t, rdb), "type", "x", "payload", payload)
		wireCheck(t, "len(Payload)", len(wireDecode(t, m).Payload), len(payload))
	})
}

func TestWireFormat_Malformed(t *testing.T) {
	t.Parallel()
	rdb, _ := wireRedis(t)
	doc, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		fields []any
		field  string // the field the error must name
		inDoc  bool   // the doc gives the error as an example
	}{
		{"no type", []any{"payload", "{}"}, "type", true},
		{"empty type", []any{"type", "", "payload", "{}"}, "type", true},
		{"attempt not a number", []any{"type", "x", "attempt", "abc"}, "attempt", true},
		{"attempt empty", []any{"type", "x", "attempt", ""}, "attempt", false},
		{"max_attempts negative", []any{"type", "x", "max_attempts", "-1"}, "max_attempts", false},
		{"created_at not Unix ms", []any{"type", "x", "created_at", "2026-01-01T00:00:00Z"}, "created_at", false},
		{"version 2", []any{"v", "2", "type", "x"}, "v", true},
		{"over 16 MiB", []any{"type", "x", "payload", strings.Repeat("x", stream.DefaultMaxEntryBytes-len("type")-len("x")-len("payload")+1)}, "payload", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := wireXAdd(t, rdb, wireStream(t, rdb), tt.fields...)
			job, err := stream.Decode(m.ID, m.Values)
			if err == nil {
				t.Fatalf("Decode accepted %v as job %+v", wireFieldNames(m), job)
			}
			var de *stream.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode error %v is a %T, want a *stream.DecodeError", err, err)
			}
			wireCheck(t, "DecodeError.Field", de.Field, tt.field)
			wireCheck(t, "DecodeError.EntryID", de.EntryID, m.ID)
			if want := fmt.Sprintf("field %q", tt.field); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %s", err, want)
			}
			// The doc's examples are of entry 1795976094814-0.
			if example := strings.ReplaceAll(err.Error(), m.ID, "1795976094814-0"); tt.inDoc && !bytes.Contains(doc, []byte(example)) {
				t.Errorf("docs/wire-format.md does not give the example error %q", example)
			}
		})
	}
}

func TestWireFormat_GoProducer(t *testing.T) {
	t.Parallel()
	rdb, _ := wireRedis(t)
	key := wireStream(t, rdb)
	job, err := stream.NewJob("invoice.send", map[string]int{"invoice_id": 1042})
	if err != nil {
		t.Fatal(err)
	}
	id, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: key}).Enqueue(t.Context(), job)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := rdb.XRange(t.Context(), key, id, id).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("XRANGE %s: %d entries, %v", id, len(msgs), err)
	}
	m := msgs[0]
	if got, want := wireFieldNames(m), []string{"content_type", "job_id", "payload", "type", "v"}; !slices.Equal(got, want) {
		t.Errorf("fields %q, want %q", got, want)
	}
	wireCheck(t, "field v", m.Values["v"], any("1"))
	wireCheck(t, "field content_type", m.Values["content_type"], any(stream.ContentTypeMsgpack))
	jobID, _ := m.Values["job_id"].(string)
	if u, err := uuid.Parse(jobID); err != nil || u.Version() != 7 {
		t.Errorf("job_id %q is not a UUIDv7 (%v)", jobID, err)
	}
	var p map[string]int
	if err := wireDecode(t, m).Decode(&p); err != nil {
		t.Fatalf("job.Decode: %v", err)
	}
	wireCheck(t, "payload.invoice_id", p["invoice_id"], 1042)
}

// TestWireFormat_Doc checks that the doc cannot drift from the snippets and
// from package stream.
func TestWireFormat_Doc(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(wireDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, name := range []string{"enqueue.sh", "enqueue.py", "enqueue.js"} {
		snippet, err := os.ReadFile(filepath.Join(wireSnippets, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(doc, string(snippet)) {
			t.Errorf("docs/wire-format.md does not contain docs/snippets/%s verbatim: paste the file's text into the doc", name)
		}
	}
	for _, field := range []string{
		stream.FieldVersion, stream.FieldType, stream.FieldPayload, stream.FieldJobID,
		stream.FieldIdempotencyKey, stream.FieldAttempt, stream.FieldMaxAttempts, stream.FieldCreatedAt,
		stream.FieldLockKey, stream.FieldContentType, stream.FieldTraceParent, stream.FieldTraceState,
		stream.FieldLastError, stream.HeaderPrefix + "<name>", stream.ContentTypeJSON, stream.ContentTypeMsgpack,
	} {
		if !strings.Contains(doc, "`"+field+"`") {
			t.Errorf("docs/wire-format.md does not mention `%s`", field)
		}
	}
	for _, name := range []string{"orders", "{shop}:orders"} {
		keys, err := stream.KeysFor(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{keys.Dead, keys.Delayed} {
			if !strings.Contains(doc, "`"+k+"`") {
				t.Errorf("docs/wire-format.md does not give the key `%s` of stream %s", k, name)
			}
		}
	}
}
