package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// Defaults of [RelayConfig].
const (
	DefaultBatchSize    = 500
	DefaultPollInterval = time.Second
	DefaultWindow       = 24 * time.Hour
)

// RelayConfig configures a [Relay]. Fields are checked by [NewRelay].
type RelayConfig struct {
	// BatchSize is the most rows one transaction relays. Defaults to
	// [DefaultBatchSize].
	BatchSize int
	// ListenDSN, when set, is a PostgreSQL connection string for the
	// relay's own LISTEN connection (pgx), so that a commit wakes it at
	// once; the relay reconnects when the connection is lost. Defaults to
	// "" (poll only).
	ListenDSN string
	// Logger receives the relay's errors (never payloads). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// PollInterval is the longest the relay waits before it looks for rows
	// again without a notification. Defaults to [DefaultPollInterval].
	PollInterval time.Duration
	// Table is the outbox table. Defaults to [DefaultTable].
	Table string
	// Window is how long the enqueue-once marker of a relayed job lives:
	// rows added again within it (after a relay died between its add and
	// its commit, or its commit's reply was lost) add nothing. It must
	// exceed the longest a committed relay transaction can stay unknown.
	// Defaults to [DefaultWindow].
	Window time.Duration
}

// Relay moves committed outbox rows to their streams. Run several (one per
// service instance): SKIP LOCKED gives each batch to one relay.
type Relay struct {
	db        *sql.DB
	rdb       redis.UniversalClient
	cfg       RelayConfig
	log       *slog.Logger
	selectQ   string
	deleteQ   string
	failQ     string
	mu        sync.Mutex
	producers map[string]*stream.Producer

	// Test hooks, called within the relay's transaction.
	// An error rolls the transaction back, as a crash would.
	afterSelect func(n int) error    // rows locked, nothing added yet
	afterStream func(s string) error // one stream's jobs added (inside the batch)
	afterAdd    func(n int) error    // rows added to their streams, not yet deleted
}

// NewRelay returns a relay that reads db's outbox table and adds to rdb.
// It returns an error naming the field of a bad cfg.
func NewRelay(db *sql.DB, rdb redis.UniversalClient, cfg RelayConfig) (*Relay, error) {
	t, err := checkTable("RelayConfig.Table", cfg.Table)
	if err != nil {
		return nil, err
	}
	cfg.Table = t
	switch {
	case cfg.BatchSize < 0:
		return nil, fmt.Errorf("outbox: RelayConfig.BatchSize (%d) must not be negative", cfg.BatchSize)
	case cfg.PollInterval < 0:
		return nil, fmt.Errorf("outbox: RelayConfig.PollInterval (%v) must not be negative", cfg.PollInterval)
	case cfg.Window != 0 && cfg.Window < time.Second:
		return nil, fmt.Errorf("outbox: RelayConfig.Window (%v) must be 0 or at least 1s", cfg.Window)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.ListenDSN != "" {
		if _, err := pgx.ParseConfig(cfg.ListenDSN); err != nil {
			return nil, fmt.Errorf("outbox: RelayConfig.ListenDSN does not parse: %w", redactDSN(err))
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Relay{
		db: db, rdb: rdb, cfg: cfg, log: log,
		selectQ:   fmt.Sprintf(`SELECT id, stream, entry FROM %s WHERE error IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, t),
		deleteQ:   fmt.Sprintf(`DELETE FROM %s WHERE id = ANY($1)`, t),
		failQ:     fmt.Sprintf(`UPDATE %s SET error = $2 WHERE id = $1`, t),
		producers: make(map[string]*stream.Producer),
	}, nil
}

// redactDSN keeps a DSN's parse error from carrying its password: pgx's
// errors name the DSN's parts, so only the error's type is kept.
func redactDSN(error) error { return errors.New("invalid connection string") }

// Run relays until ctx is cancelled, and returns nil then. Errors (Redis or
// PostgreSQL unreachable) are logged and retried with a backoff capped at
// PollInterval.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	if r.cfg.ListenDSN != "" {
		go func() {
			defer close(done)
			r.listen(ctx, wake)
		}()
	} else {
		close(done)
	}
	defer func() { <-done }()
	failures := 0
	for {
		n, err := r.RelayBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := r.cfg.PollInterval
		switch {
		case err != nil:
			failures++
			r.log.Warn("outbox: relay failed; retrying", "error", err, "failures", failures)
			wait = min(r.cfg.PollInterval, time.Duration(rand.Int64N(int64(10*time.Millisecond)<<min(failures, 10))+1))
		case n == r.cfg.BatchSize:
			failures = 0
			continue // more rows are waiting
		default:
			failures = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// RelayBatch relays one batch of at most BatchSize rows in one transaction
// and returns how many rows it relayed (or marked as failed).
func (r *Relay) RelayBatch(ctx context.Context) (int, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, r.selectQ, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("outbox: select rows: %w", err)
	}
	type row struct {
		id     int64
		stream string
		entry  []byte
	}
	var all []row
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.id, &x.stream, &x.entry); err != nil {
			rows.Close()
			return 0, fmt.Errorf("outbox: read rows: %w", err)
		}
		all = append(all, x)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("outbox: read rows: %w", err)
	}
	if len(all) == 0 {
		return 0, nil
	}
	if r.afterSelect != nil {
		if err := r.afterSelect(len(all)); err != nil {
			return 0, err
		}
	}
	// Per stream, in row order.
	jobs := map[string][]*stream.Job{}
	var order []string
	var ids []int64
	for _, x := range all {
		job, err := decodeRow(x.stream, x.entry)
		if err != nil {
			if _, err := tx.ExecContext(ctx, r.failQ, x.id, err.Error()); err != nil {
				return 0, fmt.Errorf("outbox: mark row %d: %w", x.id, err)
			}
			r.log.Error("outbox: row cannot be relayed; marked", "row", x.id, "error", err)
			continue
		}
		if _, ok := jobs[x.stream]; !ok {
			order = append(order, x.stream)
		}
		jobs[x.stream] = append(jobs[x.stream], job)
		ids = append(ids, x.id)
	}
	for _, s := range order {
		if _, err := r.producer(s).EnqueueBatch(ctx, jobs[s]); err != nil {
			return 0, fmt.Errorf("outbox: add to %s: %w", s, err)
		}
		if r.afterStream != nil {
			if err := r.afterStream(s); err != nil {
				return 0, err
			}
		}
	}
	if r.afterAdd != nil {
		if err := r.afterAdd(len(ids)); err != nil {
			return 0, err
		}
	}
	if _, err := tx.ExecContext(ctx, r.deleteQ, ids); err != nil {
		return 0, fmt.Errorf("outbox: delete relayed rows: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("outbox: commit (the jobs were added; the rows are added again, once, if it failed): %w", err)
	}
	return len(all), nil
}

// decodeRow returns the job of a row, or why it cannot be relayed.
func decodeRow(s string, entry []byte) (*stream.Job, error) {
	if _, err := stream.KeysFor(s); err != nil {
		return nil, err
	}
	id, fields, err := stream.DecodeDelayed(string(entry))
	if err != nil {
		return nil, err
	}
	m := make(map[string]any, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i]] = fields[i+1]
	}
	job, err := stream.Decode("0-0", m)
	if err != nil {
		return nil, err
	}
	if job.ID != id {
		return nil, fmt.Errorf("outbox: entry's job_id %q is not the row's %q", job.ID, id)
	}
	job.EntryID, job.Stream = "", ""
	return job, nil
}

// producer returns the enqueue-once producer of stream s, keyed by job ID.
func (r *Relay) producer(s string) *stream.Producer {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.producers[s]
	if !ok {
		p = stream.NewProducer(r.rdb, stream.ProducerConfig{
			Stream:        s,
			EnqueueOnce:   r.cfg.Window,
			OnceKey:       func(j *stream.Job) string { return j.ID },
			OnceNamespace: "relayed",
		})
		r.producers[s] = p
	}
	return p
}

// listen wakes the relay on every notification on the table's channel,
// reconnecting after a lost connection, until ctx ends.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	failures := 0
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		failures++
		r.log.Warn("outbox: LISTEN connection lost; reconnecting (polling meanwhile)", "error", err, "failures", failures)
		t := time.NewTimer(min(r.cfg.PollInterval, 10*time.Millisecond<<min(failures, 10)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := pgx.Connect(ctx, r.cfg.ListenDSN)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.Table}.Sanitize()); err != nil {
		return err
	}
	// Rows committed while we were not listening.
	select {
	case wake <- struct{}{}:
	default:
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}
