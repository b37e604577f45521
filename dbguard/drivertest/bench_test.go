package drivertest

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
)

// BenchmarkDBGuardPaired pairs, on each engine, a fenced write with the
// plain write it replaces, alternating the two (which one goes first
// alternates too) in one loop, as bench's BenchmarkGuardPaired does for
// sqlguard: a fenced single-row UPDATE (Table.Update, the success path)
// against a plain UPDATE of the same row, and a fenced transaction
// (Guard.BeginFunc around the same UPDATE) against a plain transaction
// writing the same row; and that fenced transaction against a plain one
// writing a second row in another table beside it (tx-2rows: what one more
// row write costs), and through a statement prepared once, as the guard
// writes its token (tx-2rows-prepared: the floor of any guard that stores
// its token in the database). ns/op is the fenced write's; plain-ratio is
// the fenced calls' total time over the plain ones', plain-p50-ratio the
// median over pairs of fenced time over plain time (on a loaded machine
// the total follows the few calls that waited for a CPU; the median does
// not).
//
//	go test -run '^$' -bench DBGuardPaired -count 6 ./dbguard/drivertest
func BenchmarkDBGuardPaired(b *testing.B) {
	for _, d := range dialects {
		b.Run("db="+d.String(), func(b *testing.B) {
			db := Open(b, d)
			db.Exec(b, `CREATE TABLE bench (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
			db.Exec(b, `INSERT INTO bench (id) VALUES (1)`)
			db.Exec(b, `CREATE TABLE side (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)`)
			db.Exec(b, `INSERT INTO side (id, n) VALUES (1, 0)`)
			side, err := db.SQL.Prepare(`UPDATE side SET n = ? WHERE id = 1`)
			if err != nil {
				b.Fatal(err)
			}
			defer side.Close()
			tbl, err := dbguard.NewTable(d, "", "bench", "id")
			if err != nil {
				b.Fatal(err)
			}
			g, err := dbguard.New(d)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			const update = `UPDATE bench SET value = ? WHERE id = 1`
			var tok fence.Token // grows across sub-benchmarks, so every write is accepted
			// Every write changes the row (the plain one writes "p<i>",
			// the fenced one "f<i>"): MySQL skips the log flush of an
			// UPDATE that changes nothing, which would flatter whichever
			// went second.
			inTx := func(v string) func(*sql.Tx) error {
				return func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, update, v)
					return err
				}
			}
			p := func(i int) string { return "p" + strconv.Itoa(i) }
			// twoRows is a plain transaction that writes the side row
			// (through write) and then the benchmark's row.
			twoRows := func(write func(tx *sql.Tx, i int) error) func(i int) error {
				return func(i int) error {
					tx, err := db.SQL.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					if err := write(tx, i); err != nil {
						_ = tx.Rollback()
						return err
					}
					if err := inTx(p(i))(tx); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}
			}
			f := func(i int) string { return "f" + strconv.Itoa(i) }
			pairs := []struct {
				name          string
				plain, fenced func(i int) error
			}{
				{"update", func(i int) error {
					_, err := db.SQL.ExecContext(ctx, update, p(i))
					return err
				}, func(i int) error {
					tok++
					return tbl.Update(ctx, db.SQL, []any{1}, tok, dbguard.Col("value", f(i)))
				}},
				{"tx", func(i int) error {
					tx, err := db.SQL.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					if err := inTx(p(i))(tx); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}, func(i int) error {
					tok++
					return g.BeginFunc(ctx, db.SQL, "bench", tok, inTx(f(i)))
				}},
				// The floor of a fenced transaction: the same transaction
				// writing one more row, in another table, as the advance
				// does (on SQLite, one more page in the commit).
				{"tx-2rows", twoRows(func(tx *sql.Tx, i int) error {
					_, err := tx.ExecContext(ctx, `UPDATE side SET n = ? WHERE id = 1`, i)
					return err
				}), func(i int) error {
					tok++
					return g.BeginFunc(ctx, db.SQL, "bench", tok, inTx(f(i)))
				}},
				{"tx-2rows-prepared", twoRows(func(tx *sql.Tx, i int) error {
					_, err := tx.StmtContext(ctx, side).ExecContext(ctx, i)
					return err
				}), func(i int) error {
					tok++
					return g.BeginFunc(ctx, db.SQL, "bench", tok, inTx(f(i)))
				}},
			}
			for _, pair := range pairs {
				b.Run("write="+pair.name, func(b *testing.B) {
					pairbench.AlternatePairs(b, pair.plain, pair.fenced).Report(b, "plain")
				})
			}
		})
	}
}
