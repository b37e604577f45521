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

// TestTableRefusesLockVersionNotBigint: a lock_version column of any type
// but bigint is refused, closed, with ErrLockVersionType, and nothing is
// written. With real, two distinct tokens above 2^24 (16777217 here) round
// to the same value, so a stale holder's write would pass the check;
// smallint and integer overflow on tokens a lease hands out; numeric and
// text would compare and store what the guard cannot read back as a
// token. A column changed after a connection's first write (which checked
// it) is caught by the next write: each statement re-checks the type.
func TestTableRefusesLockVersionNotBigint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, typ := range []string{"real", "double precision", "numeric", "integer", "smallint", "text", "varchar(20)", "bigint"} {
		t.Run(typ, func(t *testing.T) {
			name := "lv_" + nonIdent.ReplaceAllString(typ, "_")
			id := pgx.Identifier{name}.Sanitize()
			e.exec(t, `CREATE TABLE `+id+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, lock_version `+typ+` NOT NULL DEFAULT 0)`)
			e.exec(t, `INSERT INTO `+id+` (id, v, lock_version) VALUES (1, 0, 1000)`)
			tbl, err := sqlguard.NewTable("", name, "id")
			if err != nil {
				t.Fatal(err)
			}
			writes := []struct {
				kind  string
				write func() error
			}{
				{"update", func() error { return tbl.Update(ctx, e.Pool, []any{1}, 16777217, sqlguard.Col("v", 1)) }},
				{"upsert", func() error { return tbl.Upsert(ctx, e.Pool, []any{1}, 16777217, sqlguard.Col("v", 1)) }},
				{"insert", func() error { return tbl.Insert(ctx, e.Pool, []any{2}, 16777217, sqlguard.Col("v", 1)) }},
				{"upsert of a new row", func() error { return tbl.Upsert(ctx, e.Pool, []any{3}, 16777217, sqlguard.Col("v", 1)) }},
				{"delete", func() error { return tbl.Delete(ctx, e.Pool, []any{1}, 16777217) }},
			}
			for _, w := range writes {
				err := w.write()
				if typ == "bigint" {
					if err != nil {
						t.Fatalf("%s on bigint: %v", w.kind, err)
					}
					continue
				}
				if !errors.Is(err, fence.ErrLockVersionType) || !strings.Contains(err.Error(), "want bigint") {
					t.Fatalf("%s: got %v, want ErrLockVersionType", w.kind, err)
				}
				if errors.Is(err, fence.ErrStaleToken) || sqlguard.IsRetryable(err) {
					t.Fatalf("%s: %v must be neither stale nor retryable", w.kind, err)
				}
			}
			if typ == "bigint" {
				// The check is not remembered: a column changed after
				// the first writes is caught by the next one.
				e.exec(t, `ALTER TABLE `+id+` ALTER lock_version TYPE real`)
				if err := tbl.Update(ctx, e.Pool, []any{2}, 16777218); !errors.Is(err, fence.ErrLockVersionType) {
					t.Fatalf("after ALTER TABLE: got %v, want ErrLockVersionType", err)
				}
				return
			}
			if n := e.int64Query(t, `SELECT count(*) FROM `+id); n != 1 {
				t.Fatalf("%d rows, want the 1 untouched", n)
			}
			if n := e.int64Query(t, `SELECT v FROM `+id+` WHERE id = 1`); n != 0 {
				t.Fatal("row 1 written")
			}
		})
	}
}
