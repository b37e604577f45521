package sqlguard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencecheck/checktest"
	"github.com/fencekit/fencekit/sqlguard"
)

func TestCheckerConformance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	checktest.Run(t, checktest.Config{
		New: func(t *testing.T) (fencecheck.Checker, func(context.Context, string) (fence.Token, error)) {
			c, err := sqlguard.NewChecker(e.Pool)
			if err != nil {
				t.Fatal(err)
			}
			return c, c.Current
		},
		MaxToken: sqlguard.MaxCheckerToken,
		Checkers: 6, ChecksPerChecker: 40,
	})
}

// A Checker and a Guard on one schema keep one order per resource: a
// token checked at the boundary is compared with one advanced in a
// transaction, both ways.
func TestCheckerSharesTheGuardsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	c, err := sqlguard.NewChecker(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx, "jobs/shared", 10); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = c.Guard().BeginFunc(ctx, e.Pool, "jobs/shared", 9, func(pgx.Tx) error { ran = true; return nil })
	if se, ok := fence.AsStale(err); !ok || se.Current != 10 || ran {
		t.Fatalf("BeginFunc(9) after Check(10) = %v (fn ran: %v); want stale naming 10", err, ran)
	}
	if err := c.Guard().BeginFunc(ctx, e.Pool, "jobs/shared", 12, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if se, ok := fence.AsStale(c.Check(ctx, "jobs/shared", 11)); !ok || se.Presented != 11 || se.Current != 12 {
		t.Fatalf("Check(11) after BeginFunc(12) = %v; want stale naming both", se)
	}
}

// The pattern the docs recommend: the token advanced in the transaction
// that writes the service's state; while it is open, a newer check waits,
// and afterwards the older transaction cannot commit anything.
func TestCheckerWaitsForAnOpenAdvance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	c, err := sqlguard.NewChecker(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := c.CheckTx(ctx, tx, "jobs/open", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE open_state (v text)`); err != nil { // the service's own state, same tx
		t.Fatal(err)
	}
	done := make(chan error, 1)
	conn, err := e.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	c2, err := sqlguard.NewChecker(conn)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- c2.Check(ctx, "jobs/open", 6) }()
	waitBlocked(t, e, pid)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Check(6) after the transaction with 5 committed = %v", err)
	}
	// Now 5 is stale in a transaction too, and bad input is refused
	// before any I/O.
	tx2, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx) //nolint:errcheck
	if err := c.CheckTx(ctx, tx2, "", 7); !errors.Is(err, fencecheck.ErrInvalidResource) {
		t.Errorf("CheckTx with an empty name = %v; want fencecheck.ErrInvalidResource", err)
	}
	if se, ok := fence.AsStale(c.CheckTx(ctx, tx2, "jobs/open", 5)); !ok || se.Current != 6 {
		t.Fatalf("CheckTx(5) after Check(6) = %v; want stale naming 6", se)
	}
}

func TestCheckerErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if _, err := sqlguard.NewChecker(nil); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewChecker(nil) = %v; want ErrInvalid", err)
	}
	if _, err := sqlguard.NewChecker(e.Pool, sqlguard.WithSchema("bad\x00")); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewChecker with a bad schema = %v; want ErrInvalid", err)
	}
	counting := &countingDB{}
	c, err := sqlguard.NewChecker(counting)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		resource string
		token    fence.Token
		want     error
	}{
		{"r", 0, fence.ErrInvalidToken},
		{"r", 1 << 63, fencecheck.ErrTokenRange},
		{"", 1, fencecheck.ErrInvalidResource},
		{"a\x00b", 1, fencecheck.ErrInvalidResource},
		{string(make([]byte, sqlguard.MaxResourceLen+1)), 1, fencecheck.ErrInvalidResource},
	} {
		if err := c.Check(ctx, tc.resource, tc.token); !errors.Is(err, tc.want) || tc.token > 0 && errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("Check(%.10q, %d) = %v; want %v", tc.resource, tc.token, err, tc.want)
		}
	}
	if n := counting.calls.Load(); n != 0 {
		t.Errorf("bad input sent %d statements", n)
	}
	// A schema without the toolkit's objects.
	missing, err := sqlguard.NewChecker(e.Pool, sqlguard.WithSchema(e.Schema+"_none"))
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.Check(ctx, "r", 1); !errors.Is(err, fence.ErrNotMigrated) {
		t.Errorf("Check without migrations = %v; want ErrNotMigrated", err)
	}
	if _, err := missing.Current(ctx, "r"); !errors.Is(err, fence.ErrNotMigrated) {
		t.Errorf("Current without migrations = %v; want ErrNotMigrated", err)
	}
}

// A check whose reply is lost after the server committed it is reported
// as an unknown outcome, never as a failure or a rejection.
func TestCheckerLostReplyIsUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if pc, err := pgx.ParseConfig(e.URL); err != nil || pc.TLSConfig != nil {
		// Not a capability the checker lacks: the test needs to read the
		// server's replies to drop one, so it fails rather than skips.
		t.Fatalf("FENCE_POSTGRES_URL must not use TLS for this test (it reads the server's replies to drop one): add sslmode=disable (%v)", err)
	}
	db := newConfDB(t, e, "SELECT 1")
	c, err := sqlguard.NewChecker(db.pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	name := fmt.Sprintf("jobs/lost %p", c)
	if err := c.Check(ctx, name, 3); err != nil {
		t.Fatal(err)
	}
	db.wire.Arm()
	err = c.Check(ctx, name, 4)
	if !errors.Is(err, fence.ErrOutcomeUnknown) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check with its reply lost = %v; want fence.ErrOutcomeUnknown", err)
	}
	if got, err := c.Current(ctx, name); err != nil || got != 4 {
		t.Fatalf("after the lost reply the store holds %d, %v; want 4 (it was committed)", got, err)
	}
}
