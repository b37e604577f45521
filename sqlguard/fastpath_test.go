package sqlguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestTableWriteRoundTrips: a Table write costs one round trip when it
// succeeds, as the unfenced statement does; a rejection costs two (the
// plain write, then the exact statement that says why); a connection's
// first write to a table costs one more, for its check of the table. The
// connection runs each statement in one round trip (QueryExecModeExec), so
// that pgx's preparing of statements (once per connection and statement
// in its default mode) does not count.
func TestTableWriteRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "accounts", 1, 1)
	var w wire
	conn := e.wireConnect(t, &w, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec })
	trips := func(what string, want int64, wantErr error, write func() error) {
		t.Helper()
		before := w.RoundTrips()
		err := write()
		if wantErr == nil && err != nil || wantErr != nil && !errors.Is(err, wantErr) {
			t.Fatalf("%s: got %v, want %v", what, err, wantErr)
		}
		if got := w.RoundTrips() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	update := func(tok fence.Token, id int) func() error {
		return func() error { return tbl.Update(ctx, conn, []any{id}, tok, sqlguard.Col("balance", int(tok))) }
	}
	trips("first write", 2, nil, update(5, 1))
	trips("update", 1, nil, update(6, 1))
	trips("stale update", 2, fence.ErrStaleToken, update(4, 1))
	trips("missing row", 2, fence.ErrNotFound, update(7, 9))
	trips("insert", 1, nil, func() error { return tbl.Insert(ctx, conn, []any{3}, 9, sqlguard.Col("owner", "c")) })
	trips("upsert", 1, nil, func() error { return tbl.Upsert(ctx, conn, []any{3}, 9, sqlguard.Col("owner", "d")) })
	trips("delete", 1, nil, func() error { return tbl.Delete(ctx, conn, []any{3}, 9) })
	trips("insert of an existing row", 2, fence.ErrExists, func() error {
		return tbl.Insert(ctx, conn, []any{1}, 9, sqlguard.Col("owner", "c"))
	})
}

// TestTableFastPathNeedsUniqueKey: the one-statement success path is taken
// only where the key columns are exactly those of a unique index, checked
// at each connection's first write to the table; elsewhere the exact
// statement runs, which refuses a key matching several rows. A unique
// index dropped after a connection's first write is not seen by that
// connection: a write that then reaches several rows is reported, not
// hidden.
func TestTableFastPathNeedsUniqueKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE items (a int NOT NULL, b int NOT NULL, v int NOT NULL DEFAULT 0,
		lock_version bigint NOT NULL DEFAULT 0, CONSTRAINT items_ab UNIQUE (a, b))`)
	e.exec(t, `INSERT INTO items (a, b) VALUES (1, 1), (1, 2)`)
	byAB, err := sqlguard.NewTable("", "items", "b", "a") // any order of the index's columns
	if err != nil {
		t.Fatal(err)
	}
	byA, err := sqlguard.NewTable("", "items", "a") // a part of the index: not unique
	if err != nil {
		t.Fatal(err)
	}
	var w wire
	conn := e.wireConnect(t, &w, nil)
	trips := func(write func() error) (int64, error) {
		write() // first write: the check and the statements' preparation
		before := w.RoundTrips()
		err := write()
		return w.RoundTrips() - before, err
	}
	if n, err := trips(func() error { return byAB.Update(ctx, conn, []any{1, 1}, 5, sqlguard.Col("v", 1)) }); err != nil || n != 1 {
		t.Fatalf("unique key: %v after %d round trips, want nil after 1", err, n)
	}
	n, err := trips(func() error { return byA.Update(ctx, conn, []any{1}, 5, sqlguard.Col("v", 2)) })
	if !errors.Is(err, fence.ErrAmbiguousKey) || n != 1 {
		t.Fatalf("non-unique key: %v after %d round trips, want ErrAmbiguousKey from the exact statement alone", err, n)
	}
	if n := e.int64Query(t, `SELECT count(*) FROM items WHERE v = 2`); n != 0 {
		t.Fatalf("%d rows written through an ambiguous key", n)
	}

	// The index goes after conn's check; a duplicate comes in.
	e.exec(t, `ALTER TABLE items DROP CONSTRAINT items_ab`)
	e.exec(t, `INSERT INTO items (a, b, lock_version) VALUES (1, 1, 5)`)
	fresh := e.wireConnect(t, &w, nil)
	err = byAB.Update(ctx, fresh, []any{1, 1}, 6, sqlguard.Col("v", 3))
	if !errors.Is(err, fence.ErrAmbiguousKey) || strings.Contains(err.Error(), "wrote") {
		t.Fatalf("new connection: got %v, want ErrAmbiguousKey with nothing written", err)
	}
	err = byAB.Update(ctx, conn, []any{1, 1}, 6, sqlguard.Col("v", 4))
	if !errors.Is(err, fence.ErrAmbiguousKey) || !strings.Contains(err.Error(), "wrote 2 rows") {
		t.Fatalf("checked connection: got %v, want ErrAmbiguousKey saying it wrote 2 rows", err)
	}
}
