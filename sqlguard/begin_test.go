package sqlguard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestBeginFuncBeginQueryEndingInComment: a BeginQuery that ends in a --
// comment is sent as a statement of its own, so it cannot swallow the
// token's advance: a stale holder is rejected before fn runs and nothing
// of fn is committed, whatever the query exec mode.
func TestBeginFuncBeginQueryEndingInComment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE notes (via text NOT NULL)`)
	g, err := sqlguard.New(sqlguard.WithTxOptions(pgx.TxOptions{BeginQuery: "BEGIN ISOLATION LEVEL READ COMMITTED -- default"}))
	if err != nil {
		t.Fatal(err)
	}
	const res = "invoice/100"
	if err := g.BeginFunc(ctx, e.Pool, res, 100, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var w wire
	for _, via := range []struct {
		name string
		db   sqlguard.Beginner
	}{
		{"pool", e.Pool},
		{"conn", e.wireConnect(t, &w, nil)},
		{"simple protocol conn", e.wireConnect(t, &w, func(c *pgx.ConnConfig) {
			c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		})},
		{"exec mode conn", e.wireConnect(t, &w, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec })},
	} {
		t.Run(via.name, func(t *testing.T) {
			ran := false
			err := g.BeginFunc(ctx, via.db, res, 5, func(tx pgx.Tx) error {
				ran = true
				_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1)`, via.name)
				return err
			})
			checkOutcome(t, err, stale, 5, 100, res)
			if ran {
				t.Fatal("fn ran for a stale token")
			}
			// The holder of the current token still gets through, and the
			// user's BeginQuery is what began its transaction.
			if err := g.BeginFunc(ctx, via.db, res, 100, func(tx pgx.Tx) error {
				var iso string
				if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso); err != nil {
					return err
				}
				if iso != "read committed" {
					t.Errorf("isolation %q", iso)
				}
				_, err := tx.Exec(ctx, `INSERT INTO notes VALUES ($1)`, via.name+"/100")
				return err
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := e.int64Query(t, `SELECT count(*) FROM notes WHERE via NOT LIKE '%/100'`); n != 0 {
		t.Fatalf("%d writes of stale holders were committed", n)
	}
	if n := e.int64Query(t, `SELECT count(*) FROM notes`); n != 4 {
		t.Fatalf("%d writes of the current holder, want 4", n)
	}
	if got := e.storedToken(t, res); got != 100 {
		t.Fatalf("stored token %d, want 100", got)
	}
}

// TestBeginFuncRoundTrips: on a pool or a connection, a fenced transaction
// costs the round trips of an unfenced one (BEGIN goes with the advance);
// a Table write costs one.
func TestBeginFuncRoundTrips(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tbl := e.accountsTable(t, "accounts", 0, 0)
	var w wire
	conn := e.wireConnect(t, &w, nil)
	pool := e.wirePool(t, &w, 1)
	tok := int64(0)
	for _, via := range []struct {
		name string
		db   interface {
			sqlguard.Beginner
			sqlguard.TxBeginner
			sqlguard.DBTX
		}
	}{{"conn", conn}, {"pool", pool}} {
		for _, opts := range [][]sqlguard.Option{nil, {sqlguard.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})}} {
			g, err := sqlguard.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			update := func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 2`)
				return err
			}
			trips := func(f func() error) int64 {
				t.Helper()
				if err := f(); err != nil { // warm up: statements get prepared once per connection
					t.Fatal(err)
				}
				before := w.RoundTrips()
				if err := f(); err != nil {
					t.Fatal(err)
				}
				return w.RoundTrips() - before
			}
			plain := trips(func() error { return pgx.BeginTxFunc(ctx, via.db, g.Options().TxOptions, update) })
			fenced := trips(func() error {
				tok++
				return g.BeginFunc(ctx, via.db, "rt/"+via.name, fence.Token(tok), update)
			})
			if plain != 3 || fenced != plain {
				t.Errorf("%s %+v: fenced transaction %d round trips, plain %d; want 3 each", via.name, g.Options().TxOptions, fenced, plain)
			}
			row := trips(func() error {
				tok++
				return tbl.Update(ctx, via.db, []any{1}, fence.Token(tok), sqlguard.Col("balance", 1))
			})
			if row != 1 {
				t.Errorf("%s: Table.Update took %d round trips, want 1", via.name, row)
			}
		}
	}
}
