package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// SQLConfig configures [NewSQLStore].
type SQLConfig struct {
	// Retention is how long completed and failed records are kept before
	// [SQLStore.PurgeExpired] may delete them (and Begin treats them as
	// absent). Defaults to [DefaultRetention].
	Retention time.Duration
	// Table is the table's name, optionally schema-qualified
	// ("jobs.idempotency"); letters, digits and underscores only. Defaults
	// to [DefaultTable].
	Table string
}

// SQLStore is a [Store] in a SQL table, over database/sql. Its SQL is
// PostgreSQL's ($n placeholders, ON CONFLICT, timestamptz, bytea); the
// table (see [SQLStore.EnsureSchema]) has one row per key:
//
//	key        text PRIMARY KEY
//	status     text         -- processing, completed or failed
//	owner      text
//	expires_at timestamptz  -- processing: end of the lease; finished: end of the retention
//	result     bytea
//	reason     text
//	updated_at timestamptz
//
// Times are the database server's (now()), so workers' clocks do not
// matter. A row whose expires_at has passed counts as absent: Begin takes it
// over. Rows are not deleted by themselves: call [SQLStore.PurgeExpired]
// periodically (every few minutes) to bound the table.
//
// [SQLStore.CompleteTx] completes a record inside the caller's transaction,
// so the business write and the completion commit together or not at all.
type SQLStore struct {
	db        *sql.DB
	table     string
	retention time.Duration

	qBegin, qSelect, qFinish, qFinished, qRelease, qForget, qPurge string
}

var sqlIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// NewSQLStore returns a SQLStore on db. It returns an error wrapping
// [ErrInvalid] if cfg.Table is not a plain (optionally schema-qualified)
// identifier. It does not create the table: see EnsureSchema.
func NewSQLStore(db *sql.DB, cfg SQLConfig) (*SQLStore, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !sqlIdent.MatchString(cfg.Table) {
		return nil, fmt.Errorf("%w: SQLConfig.Table (%q) must be an identifier, optionally schema-qualified", ErrInvalid, cfg.Table)
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	t := cfg.Table
	s := &SQLStore{db: db, table: t, retention: cfg.Retention}
	// $1 key, $2 owner, $3 lease ms. The conflict update fires only on an
	// expired row (a lease or a retention that passed): the row lock makes
	// concurrent Begins of one key take turns, and the loser returns no row.
	s.qBegin = `INSERT INTO ` + t + ` AS r (key, status, owner, expires_at, result, reason, updated_at)
VALUES ($1, 'processing', $2, now() + $3::bigint * interval '1 millisecond', NULL, NULL, now())
ON CONFLICT (key) DO UPDATE SET status = 'processing', owner = EXCLUDED.owner,
  expires_at = EXCLUDED.expires_at, result = NULL, reason = NULL, updated_at = now()
WHERE r.expires_at <= now()
RETURNING r.owner`
	s.qSelect = `SELECT status, owner, result, reason FROM ` + t + ` WHERE key = $1 AND expires_at > now()`
	// $1 key, $2 owner, $3 status, $4 result, $5 reason, $6 retention ms.
	s.qFinish = `UPDATE ` + t + ` SET status = $3, result = $4, reason = $5,
  expires_at = now() + $6::bigint * interval '1 millisecond', updated_at = now()
WHERE key = $1 AND owner = $2 AND status = 'processing'`
	// $1 key, $2 owner, $3 status: already finished by this owner.
	s.qFinished = `SELECT count(*) FROM ` + t + ` WHERE key = $1 AND owner = $2 AND status = $3`
	s.qRelease = `DELETE FROM ` + t + ` WHERE key = $1 AND owner = $2 AND status = 'processing'`
	// $1 key, $2 status: a finished record that Begin would report.
	s.qForget = `DELETE FROM ` + t + ` WHERE key = $1 AND status = $2 AND expires_at > now()`
	s.qPurge = `DELETE FROM ` + t + ` WHERE expires_at <= now()`
	return s, nil
}

// Retention returns how long finished records are kept.
func (s *SQLStore) Retention() time.Duration { return s.retention }

// Table returns the table's name.
func (s *SQLStore) Table() string { return s.table }

// EnsureSchema creates the table and its expiry index if they do not exist
// (PostgreSQL). Run it once at deployment or start-up, not from many
// processes at once: concurrent CREATE TABLE IF NOT EXISTS can fail in
// PostgreSQL.
func (s *SQLStore) EnsureSchema(ctx context.Context) error {
	idx := strings.ReplaceAll(s.table, ".", "_") + "_expires_at_idx"
	if i := strings.IndexByte(s.table, '.'); i >= 0 {
		idx = s.table[i+1:] + "_expires_at_idx"
	}
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS ` + s.table + ` (
  key        text PRIMARY KEY,
  status     text NOT NULL,
  owner      text NOT NULL,
  expires_at timestamptz NOT NULL,
  result     bytea,
  reason     text,
  updated_at timestamptz NOT NULL DEFAULT now()
)`,
		`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + s.table + ` (expires_at)`,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("idem: ensure schema of %s: %w", s.table, err)
		}
	}
	return nil
}

// beginAttempts bounds Begin's loop: a row seen as present by the insert
// and gone by the select (released or purged meanwhile) makes it try again.
const beginAttempts = 10

// Begin implements [Store].
func (s *SQLStore) Begin(ctx context.Context, key, owner string, lease time.Duration) (Outcome, error) {
	if err := checkArgs(key, owner); err != nil {
		return Outcome{}, err
	}
	if err := checkLease(lease); err != nil {
		return Outcome{}, err
	}
	for range beginAttempts {
		var got string
		err := s.db.QueryRowContext(ctx, s.qBegin, key, owner, lease.Milliseconds()).Scan(&got)
		if err == nil {
			return Outcome{Status: StatusStarted, Owner: got}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return Outcome{}, fmt.Errorf("idem: begin %q: %w", key, err)
		}
		var (
			status, recOwner string
			result           []byte
			reason           sql.NullString
		)
		err = s.db.QueryRowContext(ctx, s.qSelect, key).Scan(&status, &recOwner, &result, &reason)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return Outcome{}, fmt.Errorf("idem: begin %q: %w", key, err)
		}
		o := Outcome{Owner: recOwner, Reason: reason.String}
		if len(result) > 0 {
			o.Result = result
		}
		switch status {
		case "processing":
			o.Status = StatusInProgress
		case "completed":
			o.Status = StatusCompleted
		case "failed":
			o.Status = StatusFailed
		default:
			return Outcome{}, fmt.Errorf("idem: begin %q: record has unknown status %q", key, status)
		}
		return o, nil
	}
	return Outcome{}, fmt.Errorf("idem: begin %q: record changed under %d attempts", key, beginAttempts)
}

// execer is what *sql.DB and *sql.Tx share.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// CompleteTx completes owner's processing record of key with result inside
// tx, the caller's transaction: the completion commits with the business
// write, or neither does. It returns ErrNotOwner if owner does not hold the
// record (its lease passed and another owner took it over): the caller must
// then roll back, since another owner runs the operation. It locks the row
// until tx ends, so a Begin that would take the record over waits for the
// commit and then sees it completed. Like Complete it succeeds without a
// change if owner already completed the record.
func (s *SQLStore) CompleteTx(ctx context.Context, tx *sql.Tx, key, owner string, result []byte) error {
	return s.finish(ctx, tx, key, owner, "completed", result, nil)
}

// Complete implements [Store]: CompleteTx in a transaction of its own.
func (s *SQLStore) Complete(ctx context.Context, key, owner string, result []byte) error {
	return s.finish(ctx, s.db, key, owner, "completed", result, nil)
}

// Fail implements [Store].
func (s *SQLStore) Fail(ctx context.Context, key, owner, reason string) error {
	return s.finish(ctx, s.db, key, owner, "failed", nil, &reason)
}

func (s *SQLStore) finish(ctx context.Context, ex execer, key, owner, status string, result []byte, reason *string) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	res, err := ex.ExecContext(ctx, s.qFinish, key, owner, status, result, reason, max(s.retention.Milliseconds(), 1))
	if err != nil {
		return fmt.Errorf("idem: %s %q: %w", status, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idem: %s %q: %w", status, key, err)
	}
	if n == 1 {
		return nil
	}
	var done int
	if err := ex.QueryRowContext(ctx, s.qFinished, key, owner, status).Scan(&done); err != nil {
		return fmt.Errorf("idem: %s %q: %w", status, key, err)
	}
	if done == 1 {
		return nil
	}
	return ErrNotOwner
}

// Release implements [Store].
func (s *SQLStore) Release(ctx context.Context, key, owner string) error {
	if err := checkArgs(key, owner); err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, s.qRelease, key, owner)
	if err != nil {
		return fmt.Errorf("idem: release %q: %w", key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idem: release %q: %w", key, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

// Forget implements [Store].
func (s *SQLStore) Forget(ctx context.Context, key string, status Status) (bool, error) {
	if err := checkForget(key, status); err != nil {
		return false, err
	}
	res, err := s.db.ExecContext(ctx, s.qForget, key, status.String())
	if err != nil {
		return false, fmt.Errorf("idem: forget %q: %w", key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idem: forget %q: %w", key, err)
	}
	return n == 1, nil
}

// PurgeExpired deletes the rows whose lease or retention has passed and
// returns how many it deleted. The SQL store never deletes rows otherwise:
// call it periodically.
func (s *SQLStore) PurgeExpired(ctx context.Context) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.qPurge)
	if err != nil {
		return 0, fmt.Errorf("idem: purge %s: %w", s.table, err)
	}
	return res.RowsAffected()
}
