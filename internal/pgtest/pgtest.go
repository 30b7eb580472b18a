// Package pgtest connects tests to the PostgreSQL they need: the one at
// $PG_DSN, by default postgres://postgres@127.0.0.1:5432/test (trust auth),
// through the pgx driver registered for database/sql. scripts/test.sh starts
// it when it is not answering.
package pgtest

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// DefaultDSN is used when PG_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns the test database's connection string.
func DSN() string {
	if d := os.Getenv("PG_DSN"); d != "" {
		return d
	}
	return DefaultDSN
}

// Open returns a *sql.DB for the test database, closed when t ends. It fails
// t, naming PG_DSN, when the database does not answer.
func Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", DSN())
	if err != nil {
		t.Fatalf("PostgreSQL at PG_DSN=%q: %v", DSN(), err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("PostgreSQL at PG_DSN=%q is unreachable (scripts/test.sh starts it): %v", DSN(), err)
	}
	return db
}
