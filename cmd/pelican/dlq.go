package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pelicanqueue/pelican/dlq"
	"github.com/pelicanqueue/pelican/idem"
	"github.com/pelicanqueue/pelican/middleware"
	"github.com/pelicanqueue/pelican/stream"
)

// exitInterrupted is the exit code of a replay or purge stopped by Ctrl-C
// or SIGTERM (128 + SIGINT, as shells report it).
const exitInterrupted = 130

// Defaults of the dlq subcommands' flags.
const (
	defaultDLQListLimit = 50
	defaultReplayRate   = 50
	// errorColumnWidth truncates dead_error in the ls table.
	errorColumnWidth = 60
)

func init() { commands = append(commands, newDLQCmd) }

// newDLQCmd builds `pelican dlq ls|show|replay|purge`.
func newDLQCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "dlq",
		Short: "List, inspect, replay and purge a stream's dead-letter jobs",
		Long: `dlq operates the dead-letter stream of a job stream (stream.KeysFor(<stream>).Dead,
such as {orders}:dlq for orders).

Filters (ls, replay, purge): --type and --reason (repeatable, any value matches),
--since and --until (RFC3339 such as 2026-01-02T15:04:05Z, or a duration such as
2h meaning that long ago), --error (text dead_error contains). Bad filter syntax
exits 2.

replay and purge ask for confirmation unless --yes; a declined prompt exits 3
and changes nothing. Ctrl-C stops a replay cleanly (exit 130); run the same
command again to continue where it stopped: each job is replayed once.
What replay does with idempotency records: pelican dlq replay --help.

A stream that exists neither as <stream> nor as its dead-letter stream exits 4.

A partitioned queue (stream.Partitions): --partitions N makes <stream> the
queue's name, and every subcommand treats its N partitions as one queue
(dlq.Partitioned): entries in the queue's order (by dead-letter entry ID,
equal IDs in partition order), --limit over the whole queue, ls's --after
a position <entry ID>@<partition> (as ls prints it), one confirmation, one
replay holding every partition's lease, each job replayed to the partition
it died in. show finds the entry in whichever partition holds it, by entry
ID or by job ID.`,
	}
	var partitions int
	c.PersistentFlags().IntVar(&partitions, "partitions", 0, "<stream> names a partitioned queue of this many partitions")
	c.AddCommand(newDLQLsCmd(a, &partitions), newDLQShowCmd(a, &partitions),
		newDLQReplayCmd(a, &partitions), newDLQPurgeCmd(a, &partitions))
	return c
}

// filterFlags are the filter flags shared by ls, replay and purge.
type filterFlags struct {
	types, reasons []string
	since, until   string
	errText        string
}

func (ff *filterFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&ff.types, "type", nil, "keep jobs of this type (repeatable)")
	fl.StringArrayVar(&ff.reasons, "reason", nil,
		"keep jobs dead-lettered for this reason: malformed, unknown_type, crashed, panic, exhausted, permanent (repeatable)")
	fl.StringVar(&ff.since, "since", "", "keep jobs dead-lettered at or after this time (RFC3339, or a duration ago such as 2h)")
	fl.StringVar(&ff.until, "until", "", "keep jobs dead-lettered before this time (RFC3339, or a duration ago such as 30m)")
	fl.StringVar(&ff.errText, "error", "", "keep jobs whose dead_error contains this text")
}

// filter validates the flags; errors exit 2 and name the flag.
func (ff *filterFlags) filter(now time.Time) (dlq.Filter, error) {
	f := dlq.Filter{Types: ff.types, Reasons: ff.reasons, ErrorContains: ff.errText}
	var err error
	if f.Since, err = parseWhen("--since", ff.since, now); err != nil {
		return f, err
	}
	if f.Until, err = parseWhen("--until", ff.until, now); err != nil {
		return f, err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, fail(exitUsage, "--since (%s) must be before --until (%s)",
			f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return f, nil
}

// parseWhen parses an RFC3339 time or a non-negative duration meaning that
// long before now; "" is the zero time.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fail(exitUsage, "invalid %s %q: want an RFC3339 time (2026-01-02T15:04:05Z) or a duration ago (90m, 2h)", flag, s)
}

// deadLetters is what the dlq subcommands operate: one stream's dead
// letters (*dlq.DLQ) or a partitioned queue's (*dlq.Partitioned).
type deadLetters interface {
	List(ctx context.Context, f dlq.Filter, limit int, after string) ([]dlq.Entry, string, error)
	Get(ctx context.Context, id string) (dlq.Entry, error)
	Count(ctx context.Context, f dlq.Filter) (int, error)
	Replay(ctx context.Context, f dlq.Filter, o dlq.ReplayOptions) (dlq.ReplayResult, error)
	Purge(ctx context.Context, f dlq.Filter, o dlq.PurgeOptions) (int, error)
}

// target is the dead letters a dlq subcommand operates, with their names
// for messages.
type target struct {
	deadLetters
	dead, source string           // "{orders}:dlq", "orders"; a queue's: descriptions
	part         *dlq.Partitioned // nil for a stream
	rdb          redis.UniversalClient
	close        func()
}

// partitionOf returns the partition index of the dead-letter stream an
// entry was read from (-1 for a plain stream).
func (t *target) partitionOf(e dlq.Entry) int {
	if t.part == nil {
		return -1
	}
	for i, d := range t.part.Partitions() {
		if d.Stream() == e.Stream {
			return i
		}
	}
	return -1
}

// sourceOf returns the stream a replayed entry goes back to.
func (t *target) sourceOf(e dlq.Entry) string {
	if i := t.partitionOf(e); i >= 0 {
		return t.part.Partitions()[i].Source()
	}
	return t.source
}

// openTarget connects and returns the dead letters of name: a stream, or
// with partitions > 0 a queue of that many partitions. An unknown stream
// (neither it nor its dead-letter stream exists: a mistyped name; for a
// queue, none of its partitions' streams) exits 4; a key of another type
// exits 1. A dead-letter stream whose source is gone can still be operated.
func openTarget(ctx context.Context, a *app, name string, partitions int) (*target, error) {
	var streams []string
	if partitions != 0 {
		parts, err := stream.Partitions(name, partitions)
		if err != nil {
			return nil, fail(exitUsage, "queue %q: --partitions: %v", name, err)
		}
		streams = parts
	} else if _, err := stream.KeysFor(name); err != nil {
		return nil, fail(exitUsage, "%v", err)
	}
	rdb, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	t := &target{rdb: rdb, close: func() { _ = rdb.Close() }}
	var keys []string
	if streams == nil {
		d, err := dlq.New(rdb, name, dlq.Config{})
		if err != nil {
			t.close()
			return nil, fail(exitUsage, "%v", err)
		}
		t.deadLetters, t.dead, t.source = d, d.Stream(), d.Source()
		keys = []string{d.Source(), d.Stream()}
	} else {
		p, err := dlq.NewPartitioned(rdb, name, partitions, dlq.Config{})
		if err != nil {
			t.close()
			return nil, fail(exitUsage, "%v", err)
		}
		t.deadLetters, t.part = p, p
		t.dead = fmt.Sprintf("the dead-letter streams of queue %s (%d partitions)", name, partitions)
		t.source = "their partitions"
		for _, d := range p.Partitions() {
			keys = append(keys, d.Source(), d.Stream())
		}
	}
	found := false
	for _, key := range keys {
		ok, err := streamExists(ctx, rdb, key)
		if err != nil {
			t.close()
			return nil, err
		}
		if found = ok; found {
			break
		}
	}
	if !found {
		t.close()
		if t.part != nil {
			return nil, fail(exitNotFound, "unknown queue %q: none of its %d partitions exists", name, partitions)
		}
		return nil, fail(exitNotFound, "unknown stream %q (nor is there a dead-letter stream %q)", name, t.dead)
	}
	return t, nil
}

// entryJSON is a dead-letter entry in --output json.
type entryJSON struct {
	ID string `json:"id"`
	// Partition and DeadLetterStream say where the entry is, in a
	// partitioned queue (--partitions).
	Partition        *int        `json:"partition,omitempty"`
	DeadLetterStream string      `json:"dead_letter_stream,omitempty"`
	DeadAt           time.Time   `json:"dead_at"`
	Reason           string      `json:"reason"`
	Type             string      `json:"type"`
	Attempts         int         `json:"attempts"`
	Error            string      `json:"error"`
	Consumer         string      `json:"consumer,omitempty"`
	SourceEntryID    string      `json:"source_entry_id,omitempty"`
	SourceStream     string      `json:"source_stream,omitempty"`
	JobID            string      `json:"job_id,omitempty"`
	Fields           []fieldJSON `json:"fields,omitempty"`
	Job              *jobJSON    `json:"job,omitempty"`
	DecodeError      string      `json:"decode_error,omitempty"`
}

// fieldJSON is one raw field; Encoding is "text" or "hex".
type fieldJSON struct {
	Name     string `json:"name"`
	Value    string `json:"value"`
	Encoding string `json:"encoding"`
}

// jobJSON summarises a decoded dead job.
type jobJSON struct {
	ID             string            `json:"id"`
	Type           string            `json:"type"`
	ContentType    string            `json:"content_type,omitempty"`
	PayloadBytes   int               `json:"payload_bytes"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Attempt        int               `json:"attempt"`
	MaxAttempts    int               `json:"max_attempts,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	LockKey        string            `json:"lock_key,omitempty"`
	LastError      string            `json:"last_error,omitempty"`
	ErrorHistory   []string          `json:"error_history,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

func toEntryJSON(e dlq.Entry, full bool) entryJSON {
	j := entryJSON{
		ID: e.ID, DeadAt: e.DeadAt.UTC(), Reason: e.Reason, Type: e.Type(), Attempts: e.Attempts, Error: e.Error,
		Consumer: e.Consumer, SourceEntryID: e.SourceEntryID, SourceStream: e.SourceStream,
	}
	if e.Job != nil {
		j.JobID = e.Job.ID
	} else if e.DecodeErr != nil {
		j.DecodeError = e.DecodeErr.Error()
	}
	if !full {
		return j
	}
	for _, f := range e.Fields {
		v, enc := printable(f.Value)
		j.Fields = append(j.Fields, fieldJSON{Name: f.Name, Value: v, Encoding: enc})
	}
	if job := e.Job; job != nil {
		j.Job = &jobJSON{
			ID: job.ID, Type: job.Type, ContentType: job.ContentType, PayloadBytes: len(job.Payload),
			IdempotencyKey: job.IdempotencyKey, Attempt: job.Attempt, MaxAttempts: job.MaxAttempts,
			CreatedAt: job.CreatedAt.UTC(), LockKey: job.LockKey, LastError: job.LastError,
			ErrorHistory: job.ErrorHistory, Headers: job.Headers,
		}
	}
	return j
}

// printable returns s and "text" when s is valid UTF-8 without control
// characters other than tab and newline, else its hex and "hex".
func printable(s string) (string, string) {
	if !utf8.ValidString(s) {
		return hex.EncodeToString([]byte(s)), "hex"
	}
	for _, r := range s {
		if r != '\t' && r != '\n' && !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return hex.EncodeToString([]byte(s)), "hex"
		}
	}
	return s, "text"
}

// oneLine truncates s to n runes on one line, for table cells.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// entryJSON returns e in --output json, with its partition in a
// partitioned queue.
func (t *target) entryJSON(e dlq.Entry, full bool) entryJSON {
	j := toEntryJSON(e, full)
	if i := t.partitionOf(e); i >= 0 {
		j.Partition, j.DeadLetterStream = &i, e.Stream
	}
	return j
}

func newDLQLsCmd(a *app, partitions *int) *cobra.Command {
	var ff filterFlags
	var limit int
	var after string
	cmd := &cobra.Command{
		Use:   "ls <stream>",
		Short: "List dead-letter entries, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if limit <= 0 {
				return fail(exitUsage, "invalid --limit %d: must be positive", limit)
			}
			d, err := openTarget(cmd.Context(), a, args[0], *partitions)
			if err != nil {
				return err
			}
			defer d.close()
			entries, next, err := d.List(cmd.Context(), f, limit, after)
			if err != nil {
				if after != "" && strings.Contains(err.Error(), "after:") {
					if d.part != nil {
						return fail(exitUsage, "invalid --after %q: want a position <entry ID>@<partition> such as 1700000000000-0@3, as ls prints it: %v", after, err)
					}
					return fail(exitUsage, "invalid --after %q: want a dead-letter entry ID such as 1700000000000-0", after)
				}
				return err
			}
			if a.output == "json" {
				out := make([]entryJSON, 0, len(entries))
				for _, e := range entries {
					out = append(out, d.entryJSON(e, false))
				}
				if next != "" {
					fmt.Fprintf(a.errOut, "more entries: add --after %s\n", next)
				}
				return printJSON(a, out)
			}
			cols := []string{"ID", "DEAD AT", "REASON", "TYPE", "ATTEMPTS", "ERROR"}
			if d.part != nil {
				cols = append([]string{"PARTITION"}, cols...)
			}
			t := newTable(a, cols...)
			for _, e := range entries {
				row := []any{e.ID, e.DeadAt.UTC().Format(time.RFC3339), e.Reason, oneLine(e.Type(), 40), e.Attempts,
					oneLine(e.Error, errorColumnWidth)}
				if d.part != nil {
					row = append([]any{d.partitionOf(e)}, row...)
				}
				t.Row(row...)
			}
			if err := t.Flush(); err != nil {
				return err
			}
			if next != "" {
				fmt.Fprintf(a.errOut, "more entries: add --after %s\n", next)
			}
			return nil
		},
	}
	ff.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", defaultDLQListLimit, "list at most this many entries")
	cmd.Flags().StringVar(&after, "after", "", "list entries after this dead-letter entry ID (with --partitions: after this position <entry ID>@<partition>), as the last page printed (paging)")
	return cmd
}

func newDLQShowCmd(a *app, partitions *int) *cobra.Command {
	return &cobra.Command{
		Use:   "show <stream> <dead-entry-id>",
		Short: "Show one dead-letter entry: its raw fields in order and the decoded job",
		Long: `show prints one dead-letter entry: its raw fields in order and the decoded job.
With --partitions N, <stream> names the queue and the entry is found in
whichever partition holds it, by its dead-letter entry ID or, for any other
argument, by its job ID (the partition the job ID routes to is read first).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[1]
			_, isID := stream.EntryTime(id)
			isID = isID && strings.Contains(id, "-")
			if !isID && *partitions == 0 {
				return fail(exitUsage, "invalid entry ID %q: want <ms>-<seq> such as 1700000000000-0", id)
			}
			d, err := openTarget(cmd.Context(), a, args[0], *partitions)
			if err != nil {
				return err
			}
			defer d.close()
			var e dlq.Entry
			if isID {
				e, err = d.Get(cmd.Context(), id)
			} else {
				e, err = d.part.FindJob(cmd.Context(), id)
			}
			switch {
			case errors.Is(err, dlq.ErrNotFound) && !isID:
				return fail(exitNotFound, "no job %q in %s", id, d.dead)
			case errors.Is(err, dlq.ErrNotFound):
				return fail(exitNotFound, "no entry %s in %s", id, d.dead)
			case err != nil && strings.Contains(err.Error(), "invalid stream entry ID"):
				return fail(exitUsage, "%v", err)
			case err != nil:
				return err
			}
			if a.output == "json" {
				return printJSON(a, d.entryJSON(e, true))
			}
			w := a.out
			fmt.Fprintf(w, "entry %s in %s\n\nfields:\n", e.ID, e.Stream)
			t := newTable(a)
			for _, f := range e.Fields {
				v, enc := printable(f.Value)
				if enc == "hex" {
					v = "hex:" + v
				}
				t.Row("  "+f.Name, strings.ReplaceAll(v, "\n", `\n`))
			}
			if err := t.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(w, "\njob:")
			t = newTable(a)
			t.Row("  dead", fmt.Sprintf("%s at %s after %d attempts (consumer %s)",
				orDash(e.Reason), e.DeadAt.UTC().Format(time.RFC3339Nano), e.Attempts, orDash(e.Consumer)))
			t.Row("  from", fmt.Sprintf("%s entry %s", orDash(e.SourceStream), orDash(e.SourceEntryID)))
			if job := e.Job; job != nil {
				t.Row("  id", job.ID)
				t.Row("  type", job.Type)
				ct := job.ContentType
				if ct == "" {
					ct = stream.ContentTypeJSON
				}
				t.Row("  payload", fmt.Sprintf("%d bytes, %s", len(job.Payload), ct))
				t.Row("  attempt", job.Attempt)
				if job.MaxAttempts > 0 {
					t.Row("  max attempts", job.MaxAttempts)
				}
				t.Row("  created at", job.CreatedAt.UTC().Format(time.RFC3339Nano))
				if job.IdempotencyKey != "" {
					t.Row("  idempotency key", job.IdempotencyKey)
				}
				if job.LockKey != "" {
					t.Row("  lock key", job.LockKey)
				}
				for k, v := range job.Headers {
					t.Row("  header "+k, v)
				}
			} else {
				t.Row("  decode error", fmt.Sprint(e.DecodeErr))
			}
			t.Row("  error", e.Error)
			return t.Flush()
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// confirm asks question on a.errOut and reads one line from a.in; only y
// or yes (any case) confirms, anything else (or end of input) declines with
// exit 3. --yes skips it. Ctrl-C at the prompt exits 130.
func confirm(ctx context.Context, a *app, question, declined string) error {
	if a.yes {
		return nil
	}
	fmt.Fprintf(a.errOut, "%s [y/N] ", question)
	answer := make(chan string, 1)
	go func() { // left blocked on a.in if ctx ends first; the process exits then
		line, _ := bufio.NewReader(a.in).ReadString('\n')
		answer <- line
	}()
	ctx, stop := signalContext(ctx)
	defer stop()
	var line string
	select {
	case line = <-answer:
	case <-ctx.Done():
		fmt.Fprintln(a.errOut)
		return fail(exitInterrupted, "%s", declined)
	}
	if f, ok := a.in.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
		fmt.Fprintln(a.errOut) // a terminal echoed the Enter; piped input did not
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return fail(exitRefused, "%s", declined)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress shows a replay's or purge's progress on a.errOut: a progress bar
// with rate and ETA on a terminal, otherwise a plain line per update.
type progress struct {
	a     *app
	verb  string
	total int
	bar   *progressbar.ProgressBar
	start time.Time
}

func newProgress(a *app, verb, unit string, total int) *progress {
	p := &progress{a: a, verb: verb, total: total, start: time.Now()}
	if isTerminal(a.errOut) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(a.errOut),
			progressbar.OptionSetDescription(verb),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString(unit),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetRenderBlankState(true),
		)
	}
	return p
}

// update reports done of total, at rate per second with eta left.
func (p *progress) update(done int, rate float64, eta time.Duration) {
	if p.bar != nil {
		_ = p.bar.Set(done)
		return
	}
	line := fmt.Sprintf("%s: %d/%d", p.verb, done, p.total)
	if rate > 0 {
		line += fmt.Sprintf(", %.1f/s", rate)
	}
	if eta > 0 {
		line += ", ETA " + fmtDuration(eta)
	}
	fmt.Fprintln(p.a.errOut, line)
}

// end finishes the bar line, so that later messages start on a new line.
func (p *progress) end() {
	if p.bar != nil {
		_ = p.bar.Exit()
		fmt.Fprintln(p.a.errOut)
	}
}

// signalContext is ctx, also cancelled by SIGINT or SIGTERM.
func signalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

func fmtRate(rate float64) string {
	if rate <= 0 {
		return "no rate limit"
	}
	return strconv.FormatFloat(rate, 'f', -1, 64) + "/s"
}

// replayJSON is replay's --output json.
type replayJSON struct {
	DryRun   bool `json:"dry_run"`
	Replayed int  `json:"replayed"`
	Missing  int  `json:"missing"`
	Skipped  int  `json:"skipped"`
	// Duplicates stayed dead: their idempotency key's enqueue-once marker
	// names another job.
	Duplicates int     `json:"duplicates"`
	Resumed    bool    `json:"resumed"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"rate"`
	// ForgetFailedIdempotency is --forget-failed-idempotency; Forgotten
	// counts the failed records deleted, under IdempotencyPrefix.
	ForgetFailedIdempotency bool   `json:"forget_failed_idempotency"`
	IdempotencyPrefix       string `json:"idempotency_prefix,omitempty"`
	Forgotten               int    `json:"forgotten_idempotency_records"`
}

const replayLong = `replay moves the matching dead-letter jobs back to <stream>, oldest first, each
atomically (without its dead_* fields and attempt). It asks for confirmation
unless --yes (declined: exit 3, nothing replayed).

Only one replay of a dead-letter stream runs at a time: another one exits 3.
Ctrl-C (or SIGTERM) stops it cleanly with exit 130; running the same command
(same filters) again continues where it stopped, so each job is replayed once.

Idempotency records (middleware.Idempotency): a replayed job keeps its
idempotency_key and meets the record its operation left. A job that died
exhausted, by a panic or expired left none: it runs again. A job whose
operation completed (under another job of the same key) is acknowledged without
running. A job that died with reason permanent left a failed record: it dies
again at once, reason permanent, without running. replay leaves the records as
they are unless --forget-failed-idempotency: then, just before each job moves,
it deletes the job's record if that record is failed (never a completed or a
running one), so that the job runs again. The record's key is the job's
idempotency_key, else its job ID (as with IdempotencyConfig.Missing =
MissingUseJobID). That needs the Redis store (idem.RedisStore) in the Redis of
the stream. The record of key K is the stream's namespace followed by K
({orders}:idem:K for stream orders, {shop}:orders:idem:K for {shop}:orders),
the default of the consumers' middleware; if they share records across
queues under an IdempotencyConfig.Prefix, give the same prefix with
--idempotency-prefix. Records in PostgreSQL (idem.SQLStore) are deleted with
SQL, before the replay.`

// idemPrefix returns the key prefix of the idempotency records of source's
// jobs: flag when given, else the queue's namespace, the default of
// middleware.IdempotencyConfig.Prefix.
func idemPrefix(flag, source string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	keys, err := stream.KeysFor(source)
	if err != nil {
		return "", err
	}
	return keys.Idem, nil
}

// forgetFailed returns a ReplayOptions.BeforeMove that deletes the failed
// idempotency record of each job about to be replayed (prefix + its key,
// the prefix flag or else the namespace of the stream the job goes back
// to), and the count of records it deleted.
func forgetFailed(d *target, flag string) (func(context.Context, dlq.Entry) error, *int) {
	rdb := d.rdb
	store := idem.NewRedisStore(rdb, idem.RedisConfig{})
	n := new(int)
	return func(ctx context.Context, e dlq.Entry) error {
		if e.Job == nil {
			return nil // malformed: never had a record
		}
		key := middleware.IdempotencyKey(e.Job, middleware.MissingUseJobID)
		if key == "" {
			return nil
		}
		prefix, err := idemPrefix(flag, d.sourceOf(e))
		if err != nil {
			return err
		}
		ok, err := store.Forget(ctx, prefix+key, idem.StatusFailed)
		if err != nil {
			return err
		}
		if ok {
			*n++
		}
		return nil
	}, n
}

// idemNote says what a replay does with idempotency records, for prompts.
func idemNote(forget bool, prefix string) string {
	if !forget {
		return ""
	}
	return fmt.Sprintf(", forgetting their failed idempotency records under %q", prefix)
}

func newDLQReplayCmd(a *app, partitions *int) *cobra.Command {
	var ff filterFlags
	var rate float64
	var limit int
	var dryRun, forget bool
	var prefixFlag string
	cmd := &cobra.Command{
		Use:   "replay <stream>",
		Short: "Move dead-letter jobs back to <stream>, rate-limited and resumable",
		Long:  replayLong,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if rate < 0 {
				return fail(exitUsage, "invalid --rate %v: must not be negative (0: no limit)", rate)
			}
			if limit < 0 {
				return fail(exitUsage, "invalid --limit %d: must not be negative (0: no limit)", limit)
			}
			if prefixFlag != "" && !forget {
				return fail(exitUsage, "--idempotency-prefix needs --forget-failed-idempotency")
			}
			d, err := openTarget(cmd.Context(), a, args[0], *partitions)
			if err != nil {
				return err
			}
			defer d.close()
			prefix := ""
			if forget {
				if d.part != nil && prefixFlag == "" {
					prefix = "each partition's namespace ({<partition>}:idem:)"
				} else if prefix, err = idemPrefix(prefixFlag, d.source); err != nil {
					return fail(exitUsage, "%v", err)
				}
			}
			// A dry run counts what this replay would move, from the
			// cursor of an interrupted one with the same filters.
			plan, err := d.Replay(cmd.Context(), f, dlq.ReplayOptions{DryRun: true, Limit: limit})
			if err != nil {
				return err
			}
			if dryRun || plan.Replayed == 0 {
				if a.output == "json" {
					return printJSON(a, replayJSON{DryRun: dryRun, Replayed: plan.Replayed, Resumed: plan.Resumed,
						ForgetFailedIdempotency: forget, IdempotencyPrefix: prefix})
				}
				if dryRun {
					fmt.Fprintf(a.out, "would replay %d jobs from %s to %s%s%s\n", plan.Replayed, d.dead, d.source,
						idemNote(forget, prefix), resumedNote(plan.Resumed))
				} else {
					fmt.Fprintf(a.out, "nothing to replay in %s\n", d.dead)
				}
				return nil
			}
			if err := confirm(cmd.Context(), a, fmt.Sprintf("Replay %d jobs from %s to %s at %s%s%s?",
				plan.Replayed, d.dead, d.source, fmtRate(rate), idemNote(forget, prefix), resumedNote(plan.Resumed)),
				"replay not confirmed: nothing replayed"); err != nil {
				return err
			}

			ctx, stop := signalContext(cmd.Context())
			defer stop()
			var (
				beforeMove func(context.Context, dlq.Entry) error
				forgotten  = new(int)
			)
			if forget {
				beforeMove, forgotten = forgetFailed(d, prefixFlag)
			}
			pg := newProgress(a, "replay", "jobs", plan.Replayed)
			res, err := d.Replay(ctx, f, dlq.ReplayOptions{
				BeforeMove: beforeMove,
				Rate:       rate,
				Limit:      limit,
				Progress: func(p dlq.ReplayProgress) {
					if p.Total > 0 && p.Total != pg.total {
						pg.total = p.Total
						if pg.bar != nil {
							pg.bar.ChangeMax(p.Total)
						}
					}
					pg.update(p.Matched, p.Rate, p.ETA)
				},
				ProgressInterval: progressInterval(a),
			})
			pg.end()
			idemLine := "idempotency records left as they were: a replayed job whose record failed (it died with reason permanent) dies again without running; --forget-failed-idempotency forgets those records"
			if forget {
				idemLine = fmt.Sprintf("forgot %d failed idempotency records under %q: those jobs run again", *forgotten, prefix)
			}
			switch {
			case err != nil && ctx.Err() != nil:
				fmt.Fprintf(a.errOut, "interrupted after replaying %d jobs; run the same command again to continue where it stopped\n%s\n", res.Replayed, idemLine)
				return fail(exitInterrupted, "replay interrupted")
			case errors.Is(err, dlq.ErrReplayActive):
				return fail(exitRefused, "another replay of %s is running; wait for it to finish (or for its lease to expire if it crashed): %w", d.dead, err)
			case errors.Is(err, dlq.ErrLeaseLost):
				fmt.Fprintln(a.errOut, idemLine)
				return fail(exitError, "replay stopped after %d jobs: its lease was lost; run the same command again to continue: %w", res.Replayed, err)
			case err != nil:
				fmt.Fprintln(a.errOut, idemLine)
				return fail(exitError, "replay stopped after %d jobs: %w", res.Replayed, err)
			}
			r := 0.0
			if res.Elapsed > 0 {
				r = float64(res.Replayed) / res.Elapsed.Seconds()
			}
			if a.output == "json" {
				return printJSON(a, replayJSON{Replayed: res.Replayed, Missing: res.Missing, Skipped: res.Skipped, Duplicates: res.Duplicates, Resumed: res.Resumed,
					Seconds: res.Elapsed.Seconds(), Rate: r,
					ForgetFailedIdempotency: forget, IdempotencyPrefix: prefix, Forgotten: *forgotten})
			}
			fmt.Fprintf(a.out, "replayed %d jobs from %s to %s in %s (%.1f/s)%s\n",
				res.Replayed, d.dead, d.source, fmtDuration(res.Elapsed), r, resumedNote(res.Resumed))
			if res.Missing > 0 {
				fmt.Fprintf(a.out, "%d entries were gone before their turn (purged or replayed elsewhere)\n", res.Missing)
			}
			if res.Skipped > 0 {
				fmt.Fprintf(a.out, "%d entries stay dead: they have more fields than a job may have (%d)\n", res.Skipped, stream.MaxFields)
			}
			if res.Duplicates > 0 {
				fmt.Fprintf(a.out, "%d entries stay dead: another job with the same idempotency key was enqueued once since (replay them after its window)\n", res.Duplicates)
			}
			fmt.Fprintln(a.out, idemLine)
			return nil
		},
	}
	ff.register(cmd)
	cmd.Flags().Float64Var(&rate, "rate", defaultReplayRate, "replay at most this many jobs per second (0: no limit)")
	cmd.Flags().IntVar(&limit, "limit", 0, "replay at most this many jobs (0: all); the next run continues after them")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count the jobs that would be replayed")
	cmd.Flags().BoolVar(&forget, "forget-failed-idempotency", false,
		"before moving each job, delete its idempotency record if it is failed (Redis store), so that the job runs again")
	cmd.Flags().StringVar(&prefixFlag, "idempotency-prefix", "",
		"key prefix of the idempotency records in Redis (the consumers' IdempotencyConfig.Prefix); default: the stream's namespace, such as {orders}:idem: for stream orders")
	return cmd
}

func resumedNote(resumed bool) string {
	if resumed {
		return " (continuing an interrupted replay)"
	}
	return ""
}

// progressInterval is how often progress is reported: often on a terminal,
// once a second in logs.
func progressInterval(a *app) time.Duration {
	if isTerminal(a.errOut) {
		return 100 * time.Millisecond
	}
	return time.Second
}

// purgeJSON is purge's --output json.
type purgeJSON struct {
	DryRun  bool `json:"dry_run"`
	Deleted int  `json:"deleted"`
}

func newDLQPurgeCmd(a *app, partitions *int) *cobra.Command {
	var ff filterFlags
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "purge <stream>",
		Short: "Delete dead-letter entries (all, or those matching the filters)",
		Long: `purge deletes the matching dead-letter entries (every entry without filters).
It asks for confirmation unless --yes (declined: exit 3, nothing deleted).
Ctrl-C stops it with exit 130; what was deleted stays deleted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			d, err := openTarget(cmd.Context(), a, args[0], *partitions)
			if err != nil {
				return err
			}
			defer d.close()
			n, err := d.Count(cmd.Context(), f)
			if err != nil {
				return err
			}
			if dryRun || n == 0 {
				if a.output == "json" {
					return printJSON(a, purgeJSON{DryRun: dryRun, Deleted: n})
				}
				if dryRun {
					fmt.Fprintf(a.out, "would delete %d entries from %s\n", n, d.dead)
				} else {
					fmt.Fprintf(a.out, "nothing to delete in %s\n", d.dead)
				}
				return nil
			}
			q := fmt.Sprintf("Delete %d matching entries from %s?", n, d.dead)
			if len(ff.types)+len(ff.reasons) == 0 && ff.since == "" && ff.until == "" && ff.errText == "" {
				q = fmt.Sprintf("Delete all %d entries from %s?", n, d.dead)
			}
			if err := confirm(cmd.Context(), a, q, "purge not confirmed: nothing deleted"); err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			pg := newProgress(a, "purge", "entries", n)
			deleted, err := d.Purge(ctx, f, dlq.PurgeOptions{
				Progress:         func(done int) { pg.update(min(done, pg.total), 0, 0) },
				ProgressInterval: progressInterval(a),
			})
			pg.end()
			switch {
			case err != nil && ctx.Err() != nil:
				fmt.Fprintf(a.errOut, "interrupted after deleting %d entries\n", deleted)
				return fail(exitInterrupted, "purge interrupted")
			case err != nil:
				return fail(exitError, "purge stopped after deleting %d entries: %w", deleted, err)
			}
			if a.output == "json" {
				return printJSON(a, purgeJSON{Deleted: deleted})
			}
			fmt.Fprintf(a.out, "deleted %d entries from %s\n", deleted, d.dead)
			return nil
		},
	}
	ff.register(cmd)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count the entries that would be deleted")
	return cmd
}
