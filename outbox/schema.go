package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
)

// DefaultTable is the outbox table's default name.
const DefaultTable = "pelican_outbox"

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkTable returns the table's name, DefaultTable for "", or an error
// naming field if the name is not a plain lower-case SQL identifier.
func checkTable(field, table string) (string, error) {
	if table == "" {
		return DefaultTable, nil
	}
	if !tableName.MatchString(table) {
		return "", fmt.Errorf("outbox: %s %q must be a lower-case SQL identifier (letters, digits, '_'; at most 63)", field, table)
	}
	return table, nil
}

// SchemaSQL returns the SQL that creates the outbox table (DefaultTable
// for ""), for a migration; [CreateSchema] runs it. Each row is one job
// not yet relayed: its stream, its job ID, the entry's fields (as
// stream.EncodeDelayed writes them, keyed by the job ID) and, for a row
// that could not be relayed, why.
func SchemaSQL(table string) (string, error) {
	t, err := checkTable("table", table)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	id         bigserial PRIMARY KEY,
	stream     text NOT NULL,
	job_id     text NOT NULL,
	entry      bytea NOT NULL,
	created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	error      text
);
CREATE INDEX IF NOT EXISTS %[1]s_todo ON %[1]s (id) WHERE error IS NULL;`, t), nil
}

// CreateSchema creates the outbox table (DefaultTable for "") if it does
// not exist.
func CreateSchema(ctx context.Context, db *sql.DB, table string) error {
	q, err := SchemaSQL(table)
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("outbox: create schema: %w", err)
	}
	return nil
}
