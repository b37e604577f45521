// Package migrationstest is fencekit's own test equipment, shared by the
// tests of the modules that write to fencekit's PostgreSQL tables: a
// throwaway schema with the migrations applied. It is outside the
// compatibility promise; no program of a user imports it.
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

// Pool opens a pool of at most 8 connections on the server at url whose
// search_path is schema, closed when tb ends (before Schema's drop, when
// Schema was called first).
func Pool(tb testing.TB, url, schema string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
