package drivertest

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
)

// BenchmarkUpdate pairs a fenced single-row UPDATE (Table.Update, the
// success path: one statement) with a plain UPDATE of the same row, on
// each engine, in one run:
//
//	go test -run '^$' -bench 'Update|Tx' -count 6 ./dbguard/drivertest | benchstat -col /kind -
func BenchmarkUpdate(b *testing.B) {
	for _, d := range dialects {
		b.Run("db="+d.String(), func(b *testing.B) {
			db := Open(b, d)
			db.Exec(b, `CREATE TABLE bench (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
			db.Exec(b, `INSERT INTO bench (id) VALUES (1), (2)`)
			tbl, err := dbguard.NewTable(d, "", "bench", "id")
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var tok fence.Token // rising across every call of the sub-benchmarks
			b.Run("kind=plain", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, err := db.SQL.ExecContext(ctx, `UPDATE bench SET value = ? WHERE id = ?`, "v"+strconv.Itoa(i), 2); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("kind=fenced", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					tok++
					if err := tbl.Update(ctx, db.SQL, tok, []any{1}, dbguard.Col("value", "v"+strconv.Itoa(i))); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkTx pairs a fenced transaction (Guard.BeginFunc: begin, the
// advance, the same UPDATE, commit) with a plain transaction writing the
// same row (begin, UPDATE, commit).
func BenchmarkTx(b *testing.B) {
	for _, d := range dialects {
		b.Run("db="+d.String(), func(b *testing.B) {
			db := Open(b, d)
			db.Exec(b, `CREATE TABLE bench_tx (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`)`)
			db.Exec(b, `INSERT INTO bench_tx (id) VALUES (1)`)
			g, err := dbguard.New(d)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var tok fence.Token // rising across every call of the sub-benchmarks
			write := func(tx *sql.Tx, i int) error {
				_, err := tx.ExecContext(ctx, `UPDATE bench_tx SET value = ? WHERE id = ?`, "v"+strconv.Itoa(i), 1)
				return err
			}
			b.Run("kind=plain", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					tx, err := db.SQL.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if err := write(tx, i); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("kind=fenced", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					tok++
					if err := g.BeginFunc(ctx, db.SQL, "bench", tok, func(tx *sql.Tx) error { return write(tx, i) }); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
