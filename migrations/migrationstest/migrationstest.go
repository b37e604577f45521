// Package migrationstest is fencekit's own test equipment, shared by the
// tests of the modules that write to fencekit's PostgreSQL tables: a
// throwaway schema with the migrations applied (Schema, or New with a
// pool on it), pools on a schema for tests and for the worker processes
// they start (Pool, OpenPool, ChildConfig), and a wait for a condition
// the database reports (WaitTrue). It is outside the compatibility
// promise; no program of a user imports it.
package migrationstest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// Schema creates the schema name on the PostgreSQL server at url, applies
// fencekit's migrations in it, and drops it (CASCADE) when tb ends; what
// must end before the drop (a pool on the schema) is registered with
// tb.Cleanup after Schema returns. It fails tb when the server cannot be
// reached.
func Schema(tb testing.TB, url, name string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ident := pgx.Identifier{name}.Sanitize()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("PostgreSQL is required for these tests and is not reachable at %s (set %s or run scripts/test.sh): %v",
			url, testenv.PostgresURLVar, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	db, err := migrations.Open(url, name)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		_ = db.Close()
		tb.Fatalf("migrations.Up: %v", err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
}

// Env is one test's throwaway schema with fencekit's migrations applied,
// and a pool on it.
type Env struct {
	Schema string // the schema's name
	URL    string // the server's URL (testenv.PostgresURL)
	// Pool has at most 8 connections and the search_path Schema; it is
	// closed when the test ends, before the schema is dropped.
	Pool *pgxpool.Pool
}

// ChildConfig configures a worker process that a test starts
// (testkit.StartChild) to work on an Env's schema.
type ChildConfig struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	Schema string `json:"schema"`
	// Gate is the point where the worker waits for a line on its stdin
	// (each test names its points), or "" for nowhere.
	Gate string `json:"gate"`
}

// Child returns the configuration of the worker name on e's schema,
// waiting at gate.
func (e *Env) Child(name, gate string) ChildConfig {
	return ChildConfig{Name: name, URL: e.URL, Schema: e.Schema, Gate: gate}
}

// New creates the schema name, with fencekit's migrations applied, on
// the server of testenv.PostgresURL (Schema), and opens a pool on it
// (Pool). Both are undone when tb ends.
func New(tb testing.TB, name string) *Env {
	tb.Helper()
	e := &Env{Schema: name, URL: testenv.PostgresURL()}
	Schema(tb, e.URL, e.Schema)
	e.Pool = Pool(tb, e.URL, e.Schema) // closed before the schema is dropped
	return e
}

// Pool opens a pool of at most 8 connections on the server at url whose
// search_path is schema, closed when tb ends (before Schema's drop, when
// Schema was called first).
func Pool(tb testing.TB, url, schema string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := OpenPool(ctx, url, schema)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// OpenPool opens a pool of at most 8 connections on the server at url
// whose search_path is schema, as Pool does, for a program without a
// testing.TB: a child process a test starts (testkit.StartChild). The
// caller closes it. ctx bounds the pool's first connection.
func OpenPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	return pgxpool.NewWithConfig(ctx, cfg)
}

// WaitTrue runs the query sql, which returns one boolean, on pool every
// 50 ms until it returns true. It fails tb with the message failure when
// the query has not returned true within timeout, and at once when the
// query fails (the queries, together, are bounded by timeout and a
// minute more).
func WaitTrue(tb testing.TB, pool *pgxpool.Pool, timeout time.Duration, failure, sql string, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	for deadline := time.Now().Add(timeout); ; {
		var ok bool
		if err := pool.QueryRow(ctx, sql, args...).Scan(&ok); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal(failure)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
