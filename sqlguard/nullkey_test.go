package sqlguard_test

import (
	"context"
	"database/sql"
	"errors"
	"github.com/fencekit/fencekit/fence"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fencekit/fencekit/sqlguard"
)

// TestTableRefusesNullKeyValues: a NULL key part matches no row (NULL = x
// is never true) and never conflicts in a unique index, so a key with one
// would let two writers each create "the" row. Every NULL form a caller
// can pass (nil, a typed nil pointer, a pgtype or database/sql null) is
// refused with ErrInvalid before any I/O.
func TestTableRefusesNullKeyValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE pairs (a int NOT NULL, b int, v text,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0), UNIQUE (a, b))`)
	tbl, err := sqlguard.NewTable("", "pairs", "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, null := range []struct {
		name  string
		value any
	}{
		{"nil", nil},
		{"typed nil pointer", (*int32)(nil)},
		{"pgtype null", pgtype.Int4{}},
		{"pgtype null pointer", (*pgtype.Int4)(nil)},
		{"database/sql null", sql.NullInt32{}},
	} {
		t.Run(null.name, func(t *testing.T) {
			key := []any{1, null.value}
			for kind, write := range map[string]func(db sqlguard.DBTX) error{
				"upsert": func(db sqlguard.DBTX) error { return tbl.Upsert(ctx, db, key, 5, sqlguard.Col("v", "x")) },
				"insert": func(db sqlguard.DBTX) error { return tbl.Insert(ctx, db, key, 5, sqlguard.Col("v", "x")) },
				"update": func(db sqlguard.DBTX) error { return tbl.Update(ctx, db, key, 5, sqlguard.Col("v", "x")) },
				"delete": func(db sqlguard.DBTX) error { return tbl.Delete(ctx, db, key, 5) },
			} {
				for range 2 {
					err := write(e.Pool)
					if !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), `key column "b" is NULL`) {
						t.Fatalf("%s: got %v, want ErrInvalid naming key column b", kind, err)
					}
				}
				cdb := &countingDB{}
				if err := write(cdb); !errors.Is(err, fence.ErrInvalidArgument) || cdb.calls.Load() != 0 {
					t.Fatalf("%s: %v after %d database calls; want ErrInvalid before any", kind, err, cdb.calls.Load())
				}
			}
		})
	}
	if n := e.int64Query(t, `SELECT count(*) FROM pairs`); n != 0 {
		t.Fatalf("%d rows written with a NULL key", n)
	}
	// A valid key still works (a NULL in a non-key column is just a value).
	if err := tbl.Upsert(ctx, e.Pool, []any{1, pgtype.Int4{Int32: 2, Valid: true}}, 5, sqlguard.Col("v", nil)); err != nil {
		t.Fatal(err)
	}
}
