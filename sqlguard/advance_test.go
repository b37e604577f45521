package sqlguard_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/sqlguard"
)

// TestAdvanceTakesATransaction: Advance fences the rest of a transaction
// by keeping the resource's row locked until it ends, which a pool or a
// connection in autocommit cannot do; so Advance accepts only a pgx.Tx,
// and a pool does not compile. The lock is real: a newer holder's Advance
// waits for the older transaction to end.
func TestAdvanceTakesATransaction(t *testing.T) {
	t.Parallel()
	if got, want := reflect.TypeOf((*sqlguard.Guard).Advance).In(2), reflect.TypeFor[pgx.Tx](); got != want {
		t.Fatalf("Advance takes a %v, want %v", got, want)
	}
	e := newEnv(t)
	ctx := context.Background()
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	older, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx)
	if err := g.Advance(ctx, older, "a", 4); err != nil {
		t.Fatal(err)
	}
	newerConn := connect(t, ctx, e.Schema)
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, newerConn, func(tx pgx.Tx) error { return g.Advance(ctx, tx, "a", 5) })
	}()
	waitBlocked(t, e, newerConn.PgConn().PID())
	select {
	case err := <-done:
		t.Fatalf("newer Advance returned %v while the older transaction holds the resource", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.storedToken(t, "a"); got != 5 {
		t.Fatalf("stored %d, want 5", got)
	}
}
