package pglease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/pglease/internal/pgtest"
)

// A real PgBouncer between the backend and the server. Session mode refuses
// a pooler (ErrPooler) without taking the lock; with AllowPooler it works
// behind PgBouncer in session mode. Table mode works through PgBouncer in
// transaction mode.
func TestPooler(t *testing.T) {
	c := pgtest.Start(t)
	schema := newSchema(t, c.URL)
	txn := pgtest.StartPgBouncer(t, "127.0.0.1", c.Port, "transaction")
	sess := pgtest.StartPgBouncer(t, "127.0.0.1", c.Port, "session")
	// PgBouncer 1.18 keeps no prepared statements across transactions.
	execMode := func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec }
	req := driver.Request{Name: "pooled", Owner: "a", TTL: 5 * time.Second}

	t.Run("session mode refuses a transaction pooler", func(t *testing.T) {
		b := newBackend(t, newPool(t, txn.URL, execMode), pglease.WithSchema(schema), pglease.WithMode(pglease.ModeSession))
		if _, err := b.Acquire(testkit.Context(t), req); !errors.Is(err, pglease.ErrPooler) {
			t.Fatalf("session-mode Acquire through PgBouncer (transaction mode) = %v, want ErrPooler", err)
		}
		// Nothing was left held on the server connection PgBouncer kept.
		direct := newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(pglease.ModeSession))
		g, err := direct.Acquire(testkit.Context(t), driver.Request{Name: req.Name, Owner: "b", TTL: req.TTL})
		if err != nil {
			t.Fatalf("a direct Acquire after the refusal: %v (the refused one left the lock held)", err)
		}
		if err := direct.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("session mode behind a session pooler with AllowPooler", func(t *testing.T) {
		b := newBackend(t, newPool(t, sess.URL, execMode), pglease.WithSchema(schema), pglease.WithMode(pglease.ModeSession),
			func(o *pglease.Options) { o.AllowPooler = true })
		m := testkit.NewManager(t, b, 2*time.Second)
		l, err := m.TryAcquire(testkit.Context(t), "pooled-session")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Renew(testkit.Context(t)); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})

	t.Run("table mode through a transaction pooler", func(t *testing.T) {
		m := testkit.NewManager(t, newBackend(t, newPool(t, txn.URL, execMode), pglease.WithSchema(schema)), 2*time.Second)
		other := testkit.NewManager(t, newBackend(t, newPool(t, txn.URL, execMode), pglease.WithSchema(schema)), 2*time.Second)
		l, err := m.TryAcquire(testkit.Context(t), "pooled-table")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.TryAcquire(testkit.Context(t), "pooled-table"); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("a second holder through the pooler = %v, want ErrNotAcquired", err)
		}
		time.Sleep(time.Second) // heartbeats through the pooler
		if err := l.Err(); err != nil {
			t.Fatalf("lease ended: %v", err)
		}
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
		l2, err := other.TryAcquire(testkit.Context(t), "pooled-table")
		if err != nil || l2.Token() <= l.Token() {
			t.Fatalf("after release: %v, token %v after %d", err, l2, l.Token())
		}
		_ = l2.Release(testkit.Context(t))
	})
}
