package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/sqlguard"
)

// BenchmarkGuardPaired is sqlguard's own benchmark (sqlguard/bench_test.go)
// measured the way BenchmarkCyclePaired is: every fenced write is paired
// with its plain counterpart, operation by operation, in alternating order,
// each timed on its own, on the same pool of the same PostgreSQL. A commit
// on a shared machine waits for a WAL flush that other tests' commits
// delay by up to milliseconds, which swamps the difference between two
// benchmarks run seconds apart; two writes microseconds apart see the same
// disk.
//
//   - write=update: UPDATE of one row in autocommit, plain versus
//     Table.Update (the row's lock_version checked and set in the same
//     statement).
//   - write=update-async: the same with synchronous_commit = off, so that
//     no commit waits for the disk: what is left is CPU and the network,
//     and the guard's own cost shows without the WAL flush around it.
//   - write=tx: a transaction with one UPDATE, plain (pgx.BeginFunc) versus
//     Guard.BeginFunc on the pool (BEGIN and the resource token's advance
//     in one batch: one more row written, no more round trips).
//   - write=tx-2rows: the same fenced transaction against a plain one that
//     also updates a second row, as the fence does: what is left is the
//     guard's own cost.
//
// ns/op is the fenced write's mean time; plain-ratio is that over the
// interleaved plain writes' mean; over-plain-ns/op is the difference. The
// guard's cost is CPU time (client and server), added to a plain write
// whose time is mostly its commit's WAL flush, which other processes'
// commits on the same disk stretch or not: the same over-plain-ns/op gives
// a ratio near 1 when commits are slow and a larger one when they are
// fast. Read over-plain-ns/op, and the async row, for the guard's own
// cost.
func BenchmarkGuardPaired(b *testing.B) {
	ctx := context.Background()
	pool := pgSchema(b)
	for _, sql := range []string{
		`CREATE TABLE bench (id int PRIMARY KEY, balance bigint NOT NULL, lock_version bigint NOT NULL DEFAULT 0)`,
		`INSERT INTO bench VALUES (1, 0, 0)`,
		`CREATE TABLE side (id int PRIMARY KEY, n bigint NOT NULL)`,
		`INSERT INTO side VALUES (1, 0)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	tbl := must(sqlguard.NewTable("", "bench", "id"))(b)
	g := must(sqlguard.New())(b)
	asyncCfg := pool.Config()
	asyncCfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	async, err := pgxpool.NewWithConfig(ctx, asyncCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer async.Close()
	const update = `UPDATE bench SET balance = $1 WHERE id = 1`
	var tok fence.Token // grows across sub-benchmarks, so every write is accepted
	plainUpdate := func(i int) error {
		_, err := pool.Exec(ctx, update, int64(i))
		return err
	}
	inTx := func(i int) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, update, int64(i))
			return err
		}
	}
	fencedTx := func(i int) error {
		tok++
		return g.BeginFunc(ctx, pool, "bench", tok, inTx(i))
	}
	pairs := []struct {
		name          string
		plain, fenced func(i int) error
	}{
		{"update", plainUpdate, func(i int) error {
			tok++
			return tbl.Update(ctx, pool, []any{1}, tok, sqlguard.Col("balance", int64(i)))
		}},
		{"update-async", func(i int) error {
			_, err := async.Exec(ctx, update, int64(i))
			return err
		}, func(i int) error {
			tok++
			return tbl.Update(ctx, async, []any{1}, tok, sqlguard.Col("balance", int64(i)))
		}},
		{"tx", func(i int) error { return pgx.BeginFunc(ctx, pool, inTx(i)) }, fencedTx},
		{"tx-2rows", func(i int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE side SET n = $1 WHERE id = 1`, int64(i)); err != nil {
					return err
				}
				return inTx(i)(tx)
			})
		}, fencedTx},
	}
	for _, p := range pairs {
		b.Run("write="+p.name, func(b *testing.B) {
			plainT, fencedT, n := pairbench.Alternate(b, p.plain, p.fenced)
			pairbench.ReportAlternate(b, "plain", plainT, fencedT, n)
		})
	}
}

// pgSchema creates a throwaway schema in the PostgreSQL at
// FENCE_POSTGRES_URL, applies fencekit's migrations to it, and returns a
// pool whose search_path is that schema. The schema is dropped at the end.
func pgSchema(b *testing.B) *pgxpool.Pool {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testenv.PostgresURL()
	var r [6]byte
	_, _ = rand.Read(r[:])
	schema := "fkbench_" + hex.EncodeToString(r[:])
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatalf("PostgreSQL at %s (%s): %v", url, testenv.PostgresURLVar, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			b.Errorf("drop schema %s: %v", schema, err)
		}
	})
	db, err := migrations.Open(url, schema)
	if err != nil {
		b.Fatal(err)
	}
	_, err = migrations.Up(ctx, db)
	_ = db.Close()
	if err != nil {
		b.Fatalf("migrations.Up: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close) // before the schema is dropped
	return pool
}
