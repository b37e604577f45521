package sqlguard_test

import (
	"context"
	"errors"
	"github.com/fencekit/fencekit/fence"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/sqlguard"
)

// TestMissingLockVersionNamesTheCommand: a write to a table without
// lock_version fails with ErrNoLockVersion naming the command that adds the
// column, on a pool, in a transaction, and after the column was dropped
// under a connection that had already written; an undefined column of the
// caller's own is not taken for it.
func TestMissingLockVersionNamesTheCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE plain (id int PRIMARY KEY, note text)`)
	e.exec(t, `INSERT INTO plain VALUES (1, 'x')`)
	tbl, err := sqlguard.NewTable(e.Schema, "plain", "id")
	if err != nil {
		t.Fatal(err)
	}
	want := "fencekit migrate add-lock-version --table " + e.Schema + ".plain --apply"
	check := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.Is(err, fence.ErrNoLockVersion) || !strings.Contains(err.Error(), want) || !errors.As(err, &pgErr) {
			t.Errorf("%s: %v; want ErrNoLockVersion naming %q, with the PgError", what, err, want)
		}
	}
	check("Update on a pool", tbl.Update(ctx, e.Pool, []any{1}, 5, sqlguard.Col("note", "y")))
	check("Insert on a pool", tbl.Insert(ctx, e.Pool, []any{2}, 5, sqlguard.Col("note", "y")))
	check("Upsert in a transaction", pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		return tbl.Upsert(ctx, tx, []any{3}, 5, sqlguard.Col("note", "y"))
	}))

	// A quoted, mixed-case name is spelled so that the command finds it.
	e.exec(t, `CREATE TABLE "Odd Name" (id int PRIMARY KEY)`)
	odd, err := sqlguard.NewTable(e.Schema, "Odd Name", "id")
	if err != nil {
		t.Fatal(err)
	}
	err = odd.Delete(ctx, e.Pool, []any{1}, 5)
	if wantOdd := `--table '` + e.Schema + `."Odd Name"' --apply`; !errors.Is(err, fence.ErrNoLockVersion) || !strings.Contains(err.Error(), wantOdd) {
		t.Errorf("Delete on %q: %v; want the command with %s", "Odd Name", err, wantOdd)
	}

	// The caller's own misspelt column is a plain database error.
	e.exec(t, `ALTER TABLE plain ADD COLUMN lock_version bigint NOT NULL DEFAULT 0`)
	err = tbl.Update(ctx, e.Pool, []any{1}, 5, sqlguard.Col("nonexistent", "y"))
	var pgErr *pgconn.PgError
	if errors.Is(err, fence.ErrNoLockVersion) || !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		t.Errorf("Update of a missing column of the caller's: %v; want the plain 42703", err)
	}

	// Dropped after this pool's connections took the fast path.
	if err := tbl.Update(ctx, e.Pool, []any{1}, 5, sqlguard.Col("note", "z")); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `ALTER TABLE plain DROP COLUMN lock_version`)
	for range 8 { // every connection of the pool
		if err := tbl.Update(ctx, e.Pool, []any{1}, 6, sqlguard.Col("note", "w")); !errors.Is(err, fence.ErrNoLockVersion) {
			t.Fatalf("Update after the column was dropped: %v; want ErrNoLockVersion", err)
		}
	}
}

// TestNotMigratedNamesTheCommand: a Guard whose schema lacks fencekit's
// table says where it looked and which command to run.
func TestNotMigratedNamesTheCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	empty := e.Schema + "_bare"
	e.exec(t, `CREATE SCHEMA `+pgx.Identifier{empty}.Sanitize())
	defer e.exec(t, `DROP SCHEMA `+pgx.Identifier{empty}.Sanitize())
	g, err := sqlguard.New(sqlguard.WithSchema(empty))
	if err != nil {
		t.Fatal(err)
	}
	err = g.BeginFunc(ctx, e.Pool, "r", 3, func(pgx.Tx) error { return nil })
	want := "run `fencekit migrate up --schema " + empty + "` there"
	if !errors.Is(err, fence.ErrNotMigrated) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `schema "`+empty+`"`) {
		t.Errorf("BeginFunc in a bare schema: %v; want ErrNotMigrated naming the schema and %q", err, want)
	}
}
