package sqlguard_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

func TestNewTableBadInput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 64)
	for _, tc := range []struct {
		name         string
		schema, tbl  string
		keys         []string
		wantInErrors []string // each must appear in the joined error
	}{
		{"empty table", "", "", []string{"id"}, []string{"empty table name"}},
		{"empty schema is fine, empty key is not", "", "t", []string{""}, []string{"empty key column name"}},
		{"no keys", "s", "t", nil, []string{"no key columns"}},
		{"NUL in table", "", "t\x00; DROP TABLE x", []string{"id"}, []string{"NUL"}},
		{"NUL in schema", "s\x00", "t", []string{"id"}, []string{"NUL"}},
		{"NUL in key", "", "t", []string{"i\x00d"}, []string{"NUL"}},
		{"too long", long, "t", []string{"id"}, []string{"longer than 63 bytes"}},
		{"invalid UTF-8", "", "t\xff", []string{"id"}, []string{"not valid UTF-8"}},
		{"duplicate key", "", "t", []string{"a", "b", "a"}, []string{`key column "a" given twice`}},
		{"lock_version as key", "", "t", []string{"lock_version"}, []string{"lock_version cannot be a key column"}},
		{"reserved name", "", "fencekit_cur", []string{"id"}, []string{"reserved"}},
		{"every problem at once", "", "", []string{"a", "a", "lock_version"}, []string{"empty table name", "given twice", "cannot be a key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, err := sqlguard.NewTable(tc.schema, tc.tbl, tc.keys...)
			if tbl != nil || !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("NewTable = %v, %v; want nil, ErrInvalid", tbl, err)
			}
			for _, s := range tc.wantInErrors {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
	// Punctuation is not bad input: it is quoted.
	if _, err := sqlguard.NewTable(`s"; --`, `t'; DROP TABLE x; --`, `k"`); err != nil {
		t.Fatalf("hostile but valid names: %v", err)
	}
}

func TestWriteBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl, err := sqlguard.NewTable("", "t", "k1", "k2")
	if err != nil {
		t.Fatal(err)
	}
	var typedNil *pgxpool.Pool
	for _, tc := range []struct {
		name    string
		nilDB   int // 0: counting DB, 1: nil interface, 2: typed nil pool
		token   fence.Token
		key     []any
		cols    []sqlguard.Column
		wantErr error
		wantMsg string
	}{
		{"token 0", 0, 0, []any{1, 2}, nil, fence.ErrInvalidToken, "token is 0"},
		{"token above int64", 0, math.MaxInt64 + 1, []any{1, 2}, nil, fence.ErrInvalidToken, "bigint range"},
		{"token max uint64", 0, math.MaxUint64, []any{1, 2}, nil, fence.ErrInvalidToken, "bigint range"},
		{"nil database", 1, 1, []any{1, 2}, nil, fence.ErrInvalidArgument, "nil database"},
		{"typed nil pool", 2, 1, []any{1, 2}, nil, fence.ErrInvalidArgument, "nil database"},
		{"too few key values", 0, 1, []any{1}, nil, fence.ErrInvalidArgument, "1 key values for 2 key columns"},
		{"too many key values", 0, 1, []any{1, 2, 3}, nil, fence.ErrInvalidArgument, "3 key values"},
		{"key column among columns", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col("k2", 1)}, fence.ErrInvalidArgument, "is a key column"},
		{"lock_version among columns", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col("lock_version", 9)}, fence.ErrInvalidArgument, "written by the guard only"},
		{"duplicate column", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col("a", 1), sqlguard.Col("a", 2)}, fence.ErrInvalidArgument, `"a" given twice`},
		{"empty column", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col("", 1)}, fence.ErrInvalidArgument, "empty column name"},
		{"NUL in column", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col("a\x00;DROP", 1)}, fence.ErrInvalidArgument, "NUL"},
		{"long column", 0, 1, []any{1, 2}, []sqlguard.Column{sqlguard.Col(strings.Repeat("c", 64), 1)}, fence.ErrInvalidArgument, "longer than 63"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, kind := range []string{"update", "insert", "upsert", "delete"} {
				if kind == "delete" && tc.cols != nil {
					continue // Delete takes no columns
				}
				cdb := &countingDB{}
				var db sqlguard.DBTX = cdb
				switch tc.nilDB {
				case 1:
					db = nil
				case 2:
					db = typedNil
				}
				var err error
				switch kind {
				case "update":
					err = tbl.Update(ctx, db, tc.key, tc.token, tc.cols...)
				case "insert":
					err = tbl.Insert(ctx, db, tc.key, tc.token, tc.cols...)
				case "upsert":
					err = tbl.Upsert(ctx, db, tc.key, tc.token, tc.cols...)
				case "delete":
					err = tbl.Delete(ctx, db, tc.key, tc.token)
				}
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("%s: got %v, want %v mentioning %q", kind, err, tc.wantErr, tc.wantMsg)
				}
				if n := cdb.calls.Load(); n != 0 {
					t.Errorf("%s: %d database calls before rejecting bad input", kind, n)
				}
			}
		})
	}
}

func TestGuardBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	noop := func(pgx.Tx) error { return nil }
	var (
		typedNil   *pgx.Conn
		typedNilTx *pgxpool.Tx
	)
	for _, tc := range []struct {
		name     string
		nilDB    int
		resource string
		token    fence.Token
		fn       func(pgx.Tx) error
		wantErr  error
		wantMsg  string
	}{
		{"token 0", 0, "r", 0, noop, fence.ErrInvalidToken, "token is 0"},
		{"token above int64", 0, "r", math.MaxInt64 + 1, noop, fence.ErrInvalidToken, "bigint range"},
		{"nil database", 1, "r", 1, noop, fence.ErrInvalidArgument, "nil database"},
		{"typed nil conn", 2, "r", 1, noop, fence.ErrInvalidArgument, "nil database"},
		{"empty resource", 0, "", 1, noop, fence.ErrInvalidArgument, "empty resource"},
		{"NUL in resource", 0, "a\x00b", 1, noop, fence.ErrInvalidArgument, "NUL"},
		{"invalid UTF-8 resource", 0, "a\xffb", 1, noop, fence.ErrInvalidArgument, "UTF-8"},
		{"long resource", 0, strings.Repeat("r", sqlguard.MaxResourceLen+1), 1, noop, fence.ErrInvalidArgument, "longer than 1024 bytes"},
		{"nil fn", 0, "r", 1, nil, fence.ErrInvalidArgument, "nil function"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cdb := &countingDB{}
			var (
				b sqlguard.Beginner = cdb
				d pgx.Tx            = countingTx{c: cdb}
			)
			switch tc.nilDB {
			case 1:
				b, d = nil, nil
			case 2:
				b, d = typedNil, typedNilTx
			}
			err := g.BeginFunc(ctx, b, tc.resource, tc.token, tc.fn)
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("BeginFunc: got %v, want %v mentioning %q", err, tc.wantErr, tc.wantMsg)
			}
			if tc.fn != nil {
				err = g.Advance(ctx, d, tc.resource, tc.token)
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("Advance: got %v, want %v mentioning %q", err, tc.wantErr, tc.wantMsg)
				}
			}
			if n := cdb.calls.Load(); n != 0 {
				t.Errorf("%d database calls before rejecting bad input", n)
			}
		})
	}
}

func TestNewGuardBadOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		opts    []sqlguard.Option
		wantMsg []string
	}{
		{"NUL in schema", []sqlguard.Option{sqlguard.WithSchema("a\x00")}, []string{"NUL"}},
		{"long schema", []sqlguard.Option{sqlguard.WithSchema(strings.Repeat("s", 64))}, []string{"longer than 63"}},
		{"read only", []sqlguard.Option{sqlguard.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly})}, []string{"read-only"}},
		{"unknown values, all reported", []sqlguard.Option{sqlguard.WithTxOptions(pgx.TxOptions{
			IsoLevel: "chaotic", AccessMode: "write only", DeferrableMode: "later"})},
			[]string{"isolation level", "access mode", "deferrable mode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := sqlguard.New(tc.opts...)
			if g != nil || !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("New = %v, %v; want nil, ErrInvalid", g, err)
			}
			for _, s := range tc.wantMsg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
	// The caller's options are not mutated and a nil Option is ignored.
	txo := pgx.TxOptions{IsoLevel: pgx.Serializable}
	g, err := sqlguard.New(nil, sqlguard.WithTxOptions(txo), sqlguard.WithSchema("s"))
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Options(); got.Schema != "s" || got.TxOptions != txo {
		t.Fatalf("Options() = %+v", got)
	}
}

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	if sqlguard.IsRetryable(nil) || sqlguard.IsRetryable(errors.New("x")) || sqlguard.IsRetryable(fence.Stale("r", 1, 2)) {
		t.Fatal("IsRetryable matched a non-retryable error")
	}
	if !sqlguard.IsRetryable(&fence.RetryableError{Op: "x", Err: errors.New("y")}) {
		t.Fatal("IsRetryable missed a *RetryableError")
	}
}
