package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/pelicanqueue/pelican/stream"
)

// WriterConfig configures a [Writer].
type WriterConfig struct {
	// Stream is the stream the jobs go to. Required.
	Stream string
	// Table is the outbox table, as given to [CreateSchema]. Defaults to
	// [DefaultTable].
	Table string
}

// Execer runs a statement: *sql.Tx (the point of an outbox), *sql.Conn or
// *sql.DB.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Writer writes jobs for one stream into the outbox table.
type Writer struct {
	stream  string
	insert  string
	channel string // NOTIFY channel: the table's name
}

// NewWriter returns a writer for cfg.Stream. It returns an error naming
// the field if cfg.Stream is not a valid stream name or cfg.Table not a
// plain SQL identifier.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if _, err := stream.KeysFor(cfg.Stream); err != nil {
		return nil, fmt.Errorf("outbox: WriterConfig.Stream: %w", err)
	}
	t, err := checkTable("WriterConfig.Table", cfg.Table)
	if err != nil {
		return nil, err
	}
	// One statement: the insert and the relays' wake-up, sent at commit.
	q := fmt.Sprintf(`WITH row AS (INSERT INTO %s (stream, job_id, entry) VALUES ($1, $2, $3) RETURNING id)
SELECT pg_notify($4, '') FROM row`, t)
	return &Writer{stream: cfg.Stream, insert: q, channel: t}, nil
}

// Enqueue writes job into the outbox within tx: it reaches the stream once
// tx commits (once a [Relay] runs), and never if tx rolls back. It sets
// job.ID to a new UUIDv7 when it is empty. The job is encoded as
// stream.Encode writes it.
func (w *Writer) Enqueue(ctx context.Context, tx Execer, job *stream.Job) error {
	if job == nil || job.Type == "" {
		return errors.New("outbox: job has no Type")
	}
	if job.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("outbox: new job ID: %w", err)
		}
		job.ID = id.String()
	}
	entry := stream.EncodeDelayed(job.ID, stream.Encode(job))
	if _, err := tx.ExecContext(ctx, w.insert, w.stream, job.ID, []byte(entry), w.channel); err != nil {
		return fmt.Errorf("outbox: enqueue %s job %s: %w", job.Type, job.ID, err)
	}
	return nil
}
