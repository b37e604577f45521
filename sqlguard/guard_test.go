package sqlguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/sqlguard"
)

func TestNamesMatchMigrations(t *testing.T) {
	if sqlguard.ResourceTable != migrations.ResourceTable ||
		sqlguard.AdvanceFunction != migrations.AdvanceFunction ||
		sqlguard.LockVersionColumn != migrations.LockVersionColumn {
		t.Fatal("sqlguard and migrations disagree on the toolkit's object names")
	}
}

// onlyBegin hides everything but Begin, forcing BeginFunc's generic path.
type onlyBegin struct{ b sqlguard.Beginner }

func (o onlyBegin) Begin(ctx context.Context) (pgx.Tx, error) { return o.b.Begin(ctx) }

// advanceInTx runs g.Advance in a transaction of its own on db.
func advanceInTx(ctx context.Context, g *sqlguard.Guard, db sqlguard.Beginner, resource string, token fence.Token) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return g.Advance(ctx, tx, resource, token) })
}

func (e *env) storedToken(t *testing.T, resource string) int64 {
	t.Helper()
	return e.int64Query(t, `SELECT coalesce((SELECT token FROM fencekit_resource_tokens WHERE resource = $1), 0)`, resource)
}

func TestGuardBeginFuncOutcomes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	e.exec(t, `CREATE TABLE notes (resource text, token bigint)`)
	conn := connect(t, ctx, e.Schema)

	for _, via := range []struct {
		name string
		db   func(t *testing.T) sqlguard.Beginner
	}{
		{"pool", func(*testing.T) sqlguard.Beginner { return e.Pool }},
		{"conn", func(*testing.T) sqlguard.Beginner { return conn }},
		{"generic", func(*testing.T) sqlguard.Beginner { return onlyBegin{e.Pool} }},
		{"savepoint", func(t *testing.T) sqlguard.Beginner {
			tx, err := e.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := tx.Commit(ctx); err != nil {
					t.Errorf("outer commit: %v", err)
				}
			})
			return tx
		}},
	} {
		t.Run(via.name, func(t *testing.T) {
			res := "orders/" + via.name
			note := func(tok fence.Token) func(pgx.Tx) error {
				return func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1, $2)`, res, int64(tok))
					return err
				}
			}
			// Each step uses a fresh Beginner (for "savepoint", a fresh
			// outer transaction, committed at the end of the subtest).
			db := via.db(t)
			if err := g.BeginFunc(ctx, db, res, 5, note(5)); err != nil {
				t.Fatalf("first: %v", err)
			}
			if err := g.BeginFunc(ctx, db, res, 5, note(5)); err != nil {
				t.Fatalf("same token again: %v", err)
			}
			if err := g.BeginFunc(ctx, db, res, 7, note(7)); err != nil {
				t.Fatalf("newer: %v", err)
			}
			ran := false
			err := g.BeginFunc(ctx, db, res, 6, func(tx pgx.Tx) error { ran = true; return nil })
			checkOutcome(t, err, stale, 6, 7, res)
			if ran {
				t.Fatal("fn ran for a stale token")
			}
			fnErr := errors.New("boom")
			if err := g.BeginFunc(ctx, db, res, 9, func(tx pgx.Tx) error {
				if err := note(9)(tx); err != nil {
					return err
				}
				return fnErr
			}); !errors.Is(err, fnErr) {
				t.Fatalf("fn error: got %v", err)
			}
			// The connection is usable after a stale rejection and a rollback.
			if err := g.BeginFunc(ctx, db, res, 8, note(8)); err != nil {
				t.Fatalf("after rollback: %v", err)
			}
		})
	}
	// Check the results after the savepoint's outer transaction committed.
	t.Run("results", func(t *testing.T) {
		for _, via := range []string{"pool", "conn", "generic", "savepoint"} {
			res := "orders/" + via
			if got := e.storedToken(t, res); got != 8 {
				t.Errorf("%s: stored token %d, want 8 (the rolled-back 9 must not stay)", via, got)
			}
			var got []int64
			rows, err := e.Pool.Query(ctx, `SELECT token FROM notes WHERE resource = $1 ORDER BY token`, res)
			if err != nil {
				t.Fatal(err)
			}
			got, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{5, 5, 7, 8}; !equal(got, want) {
				t.Errorf("%s: notes %v, want %v", via, got, want)
			}
		}
	})
	if conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("connection left in transaction status %c", conn.PgConn().TxStatus())
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGuardStaleHolderCannotCommit: a holder whose transaction began before
// a newer holder committed cannot commit anything afterwards.
func TestGuardStaleHolderCannotCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	e.exec(t, `CREATE TABLE data (who text)`)

	t.Run("BeginFunc waits for the newer holder, then is rejected", func(t *testing.T) {
		const res = "r1"
		advanced, release := make(chan struct{}), make(chan struct{})
		newDone := make(chan error, 1)
		go func() {
			newDone <- g.BeginFunc(ctx, e.Pool, res, 7, func(tx pgx.Tx) error {
				close(advanced)
				<-release
				_, err := tx.Exec(ctx, `INSERT INTO data VALUES ('new')`)
				return err
			})
		}()
		<-advanced
		// The old holder begins while the new one is still open.
		oldConn := connect(t, ctx, e.Schema)
		oldDone := make(chan error, 1)
		ran := make(chan struct{}, 1)
		go func() {
			oldDone <- g.BeginFunc(ctx, oldConn, res, 5, func(tx pgx.Tx) error {
				ran <- struct{}{}
				_, err := tx.Exec(ctx, `INSERT INTO data VALUES ('old')`)
				return err
			})
		}()
		waitBlocked(t, e, oldConn.PgConn().PID())
		close(release)
		if err := <-newDone; err != nil {
			t.Fatalf("new holder: %v", err)
		}
		checkOutcome(t, <-oldDone, stale, 5, 7, res)
		if len(ran) != 0 {
			t.Fatal("stale holder's fn ran")
		}
		if n := e.int64Query(t, `SELECT count(*) FROM data WHERE who = 'old'`); n != 0 {
			t.Fatalf("stale holder's write landed")
		}
	})

	t.Run("own transaction: work before Advance cannot commit", func(t *testing.T) {
		const res = "r2"
		oldConn := connect(t, ctx, e.Schema)
		txOld, err := oldConn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txOld.Rollback(ctx)
		if _, err := txOld.Exec(ctx, `INSERT INTO data VALUES ('old2')`); err != nil {
			t.Fatal(err)
		}
		if err := g.BeginFunc(ctx, e.Pool, res, 7, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO data VALUES ('new2')`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		checkOutcome(t, g.Advance(ctx, txOld, res, 5), stale, 5, 7, res)
		if err := txOld.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Fatalf("commit after stale Advance: got %v, want pgx.ErrTxCommitRollback", err)
		}
		if n := e.int64Query(t, `SELECT count(*) FROM data WHERE who = 'old2'`); n != 0 {
			t.Fatalf("stale holder's write landed")
		}
	})

	t.Run("repeatable read: serialization failure is retryable, retry is stale", func(t *testing.T) {
		const res = "r3"
		if err := g.BeginFunc(ctx, e.Pool, res, 3, func(pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		rr, err := sqlguard.New(sqlguard.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead}))
		if err != nil {
			t.Fatal(err)
		}
		txOld, err := e.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer txOld.Rollback(ctx)
		if _, err := txOld.Exec(ctx, `SELECT 1 FROM data`); err != nil { // snapshot
			t.Fatal(err)
		}
		if err := rr.BeginFunc(ctx, e.Pool, res, 7, func(pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		checkRetryable(t, rr.Advance(ctx, txOld, res, 9), "40001")
		if err := rr.BeginFunc(ctx, e.Pool, res, 5, func(pgx.Tx) error { return nil }); !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("retry: want stale, got %v", err)
		}
	})
}

func TestGuardAdvance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := advanceInTx(ctx, g, e.Pool, "a", 4); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		return g.Advance(ctx, tx, "a", 4)
	})
	if err != nil {
		t.Fatalf("equal token: %v", err)
	}
	checkOutcome(t, advanceInTx(ctx, g, e.Pool, "a", 3), stale, 3, 4, "a")
	if err := advanceInTx(ctx, g, e.Pool, "a", 1<<62); err != nil {
		t.Fatal(err)
	}
	if got := e.storedToken(t, "a"); got != 1<<62 {
		t.Fatalf("stored %d", got)
	}
	// Resource names are values, never SQL.
	for _, res := range []string{`'); DROP TABLE fencekit_resource_tokens; --`, `\'`, `$$`, "ü/ø"} {
		conn := connect(t, ctx, e.Schema)
		if err := g.BeginFunc(ctx, conn, res, 2, func(pgx.Tx) error { return nil }); err != nil {
			t.Fatalf("%q: %v", res, err)
		}
		checkOutcome(t, g.BeginFunc(ctx, conn, res, 1, func(pgx.Tx) error { return nil }), stale, 1, 2, res)
		if got := e.storedToken(t, res); got != 2 {
			t.Fatalf("%q: stored %d", res, got)
		}
	}
}

// TestGuardSchemaOption: WithSchema finds the toolkit's objects in a schema
// that is not on the search_path; a schema without them is ErrNotMigrated.
func TestGuardSchemaOption(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	plain, err := pgxpool.New(ctx, e.URL) // default search_path
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	g, err := sqlguard.New(sqlguard.WithSchema(e.Schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.BeginFunc(ctx, plain, "s", 3, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := e.storedToken(t, "s"); got != 3 {
		t.Fatalf("stored %d", got)
	}
	checkOutcome(t, advanceInTx(ctx, g, plain, "s", 2), stale, 2, 3, "s")

	e.exec(t, `CREATE SCHEMA `+pgx.Identifier{e.Schema + "_empty"}.Sanitize())
	defer e.exec(t, `DROP SCHEMA `+pgx.Identifier{e.Schema + "_empty"}.Sanitize())
	for _, schema := range []string{e.Schema + "_empty", e.Schema + "_missing"} {
		bad, err := sqlguard.New(sqlguard.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		if err := bad.BeginFunc(ctx, plain, "s", 3, func(pgx.Tx) error { return nil }); !errors.Is(err, fence.ErrNotMigrated) {
			t.Fatalf("%s: BeginFunc: want ErrNotMigrated, got %v", schema, err)
		}
		if err := advanceInTx(ctx, bad, plain, "s", 3); !errors.Is(err, fence.ErrNotMigrated) {
			t.Fatalf("%s: Advance: want ErrNotMigrated, got %v", schema, err)
		}
	}
}

// TestGuardFencesRowWrites: a Table write inside BeginFunc is fenced by
// both the resource and the row.
func TestGuardWithTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "accounts", 1, 1)
	g, err := sqlguard.New(sqlguard.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.ReadCommitted, DeferrableMode: pgx.NotDeferrable}))
	if err != nil {
		t.Fatal(err)
	}
	err = g.BeginFunc(ctx, e.Pool, "account/1", 5, func(tx pgx.Tx) error {
		return tbl.Update(ctx, tx, []any{1}, 5, sqlguard.Col("balance", 1))
	})
	if err != nil {
		t.Fatal(err)
	}
	err = g.BeginFunc(ctx, e.Pool, "account/1", 6, func(tx pgx.Tx) error {
		if err := tbl.Update(ctx, tx, []any{1}, 6, sqlguard.Col("balance", 2)); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err == nil || err.Error() != "abort" {
		t.Fatalf("got %v", err)
	}
	if got := e.row(t, "accounts", 1); got != (row{true, "ann", 1, 5}) {
		t.Fatalf("row %+v: the rolled-back write must not stay", got)
	}
}
