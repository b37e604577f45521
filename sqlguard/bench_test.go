package sqlguard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// Benchmarks against the real PostgreSQL, fenced and unfenced side by side.
// Compare with:
//
//	go test -run '^$' -bench . -count 6 ./sqlguard/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /kind bench.txt

const benchUpdate = `UPDATE bench SET balance = $1 WHERE id = $2`

func benchEnv(b *testing.B) (*env, *sqlguard.Table, *sqlguard.Guard) {
	e := newEnv(b)
	e.exec(b, `CREATE TABLE bench (id int PRIMARY KEY, balance bigint NOT NULL, lock_version bigint NOT NULL DEFAULT 0)`)
	e.exec(b, `INSERT INTO bench VALUES (1, 0, 0)`)
	tbl, err := sqlguard.NewTable("", "bench", "id")
	if err != nil {
		b.Fatal(err)
	}
	g, err := sqlguard.New()
	if err != nil {
		b.Fatal(err)
	}
	return e, tbl, g
}

// BenchmarkUpdate: one single-row UPDATE in autocommit, plain versus fenced.
func BenchmarkUpdate(b *testing.B) {
	e, tbl, _ := benchEnv(b)
	ctx := context.Background()
	var tok fence.Token // grows across runs, so every write is accepted
	b.Run("kind=plain", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := e.Pool.Exec(ctx, benchUpdate, int64(i), 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kind=fenced", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			tok++
			if err := tbl.Update(ctx, e.Pool, []any{1}, tok, sqlguard.Col("balance", int64(i))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkTx: a transaction with one UPDATE, plain (pgx.BeginFunc) versus
// fenced (Guard.BeginFunc on the pool: BEGIN and the advance in one message),
// and fenced through the generic Beginner path (BEGIN, then the advance:
// one more round trip). plain+row is a plain transaction that also updates
// a row of a second table, as the fence does.
func BenchmarkTx(b *testing.B) {
	e, _, g := benchEnv(b)
	ctx := context.Background()
	var tok fence.Token
	update := func(i int) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, benchUpdate, int64(i), 1)
			return err
		}
	}
	b.Run("kind=plain", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := pgx.BeginFunc(ctx, e.Pool, update(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The fence writes one row of fencekit_resource_tokens per transaction;
	// this baseline writes one row of another table instead, to separate
	// the cost of that write from the cost of the guard.
	e.exec(b, `CREATE TABLE side (id int PRIMARY KEY, n bigint NOT NULL)`)
	e.exec(b, `INSERT INTO side VALUES (1, 0)`)
	b.Run("kind=plain+row", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE side SET n = $1 WHERE id = 1`, int64(i)); err != nil {
					return err
				}
				return update(i)(tx)
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kind=fenced", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			tok++
			if err := g.BeginFunc(ctx, e.Pool, "bench", tok, update(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kind=fenced-generic", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			tok++
			if err := g.BeginFunc(ctx, onlyBegin{e.Pool}, "bench", tok, update(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
