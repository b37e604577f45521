package sqlguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestStaleWithUnreadableCurrentToken: a rejection (SQLSTATE FK409) whose
// DETAIL is not a token still matches fence.ErrStaleToken; the
// *fence.StaleError then carries Current = fence.None (unknown), and the
// *pgconn.PgError stays in the chain.
func TestStaleWithUnreadableCurrentToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// A function that rejects like fencekit's, with a DETAIL that is no
	// number (as a different version of the function might send).
	e.exec(t, `CREATE OR REPLACE FUNCTION fencekit_advance_token(p_resource text, p_token bigint)
		RETURNS bigint LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION USING ERRCODE = 'FK409', MESSAGE = 'stale', DETAIL = 'current token: unknown';
		END $$`)
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("%s: %v does not match fence.ErrStaleToken", name, err)
		}
		se, _ := fence.AsStale(err)
		if se == nil || se.Presented != 5 || se.Current != fence.None || se.Resource != "r" {
			t.Fatalf("%s: stale error %+v, want presented 5, current 0 (unknown), resource r", name, se)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "FK409" {
			t.Fatalf("%s: PgError FK409 not in %v", name, err)
		}
		if sqlguard.IsRetryable(err) {
			t.Fatalf("%s: a stale error is not retryable", name)
		}
	}
	ran := false
	check("BeginFunc", g.BeginFunc(ctx, e.Pool, "r", 5, func(pgx.Tx) error { ran = true; return nil }))
	if ran {
		t.Fatal("fn ran")
	}
	check("Advance", pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return g.Advance(ctx, tx, "r", 5) }))
}
