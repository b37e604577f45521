package sqlguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/sqlguard"
)

type callKey struct{}

// checkEvent fails unless the one event recorded describes the call that
// returned err, made with a context carrying the value call.
func checkEvent(t *testing.T, rec *guardtest.Recorder, call, class, op string, token fence.Token, err error, want fence.Outcome) {
	t.Helper()
	ev := rec.Take()
	if len(ev) != 1 {
		t.Fatalf("%s: %d events, want 1: %+v", call, len(ev), ev)
	}
	e := ev[0]
	if e.Guard != "sqlguard" || e.Class != class || e.Op != op || e.Token != token || e.Outcome != want {
		t.Fatalf("%s: event guard %q class %q op %q token %d outcome %q, want sqlguard %q %q %d %q", call, e.Guard, e.Class, e.Op, e.Token, e.Outcome, class, op, token, want)
	}
	if e.Err != err || fence.OutcomeOf(err) != want {
		t.Fatalf("%s: event error %v, call returned %v (outcome %q)", call, e.Err, err, fence.OutcomeOf(err))
	}
	if e.Ctx == nil || e.Ctx.Value(callKey{}) != call {
		t.Fatalf("%s: the event does not carry the call's context", call)
	}
	if e.Start.IsZero() || e.Duration <= 0 {
		t.Fatalf("%s: start %v, duration %v", call, e.Start, e.Duration)
	}
}

// Every guarded write reports one event with its outcome, classified from
// the error the caller got, against the real database.
func TestObserverSeesEveryWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &guardtest.Recorder{}
	tbl := e.accountsTable(t, "observed", 5, 5).WithObserver(rec)
	call := func(name string) context.Context {
		return context.WithValue(context.Background(), callKey{}, name)
	}

	err := tbl.Update(call("accepted"), e.Pool, []any{1}, 6, sqlguard.Col("balance", 1))
	checkEvent(t, rec, "accepted", "observed", "update", 6, err, fence.Accepted)
	err = tbl.Update(call("stale"), e.Pool, []any{2}, 4, sqlguard.Col("balance", 1))
	checkEvent(t, rec, "stale", "observed", "update", 4, err, fence.Rejected)
	err = tbl.Delete(call("missing"), e.Pool, []any{3}, 9)
	checkEvent(t, rec, "missing", "observed", "delete", 9, err, fence.Failed)
	if !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("delete of a missing row: %v", err)
	}
	err = tbl.Insert(call("bad"), e.Pool, []any{4}, fence.None)
	checkEvent(t, rec, "bad", "observed", "insert", fence.None, err, fence.Failed)

	// Unknown: the write is at the server, waiting on a row lock, when its
	// context is cancelled (cancelled only once the server says it waits).
	holder, err := e.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(context.Background(), `SELECT 1 FROM observed WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, context.Background(), e.Schema)
	wctx, cancel := context.WithCancel(call("unknown"))
	done := make(chan error, 1)
	go func() { done <- tbl.Upsert(wctx, conn, []any{1}, 7, sqlguard.Col("owner", "x")) }()
	waitBlocked(t, e, conn.PgConn().PID())
	cancel()
	err = <-done
	checkEvent(t, rec, "unknown", "observed", "upsert", 7, err, fence.Unknown)
	_ = holder.Rollback(context.Background())

	// The table without an observer reports nothing.
	plain, err := sqlguard.NewTable("", "observed", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Update(context.Background(), e.Pool, []any{1}, 8); err != nil {
		t.Fatal(err)
	}
	if ev := rec.Take(); len(ev) != 0 {
		t.Fatalf("a table without an observer reported %+v", ev)
	}

	g, err := sqlguard.New(sqlguard.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	err = g.BeginFunc(call("tx"), e.Pool, "observed-resource", 3, func(pgx.Tx) error { return nil })
	checkEvent(t, rec, "tx", "transaction", "transaction", 3, err, fence.Accepted)
	err = g.BeginFunc(call("tx-stale"), e.Pool, "observed-resource", 2, func(pgx.Tx) error { return nil })
	checkEvent(t, rec, "tx-stale", "transaction", "transaction", 2, err, fence.Rejected)
	err = pgx.BeginFunc(context.Background(), e.Pool, func(tx pgx.Tx) error {
		err := g.Advance(call("advance"), tx, "observed-resource", 3)
		checkEvent(t, rec, "advance", "transaction", "advance", 3, err, fence.Accepted)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
