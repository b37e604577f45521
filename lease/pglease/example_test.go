package pglease_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/pglease"
)

// A lease in PostgreSQL, table mode, in the schema where `fencekit migrate
// up --schema billing` created the tables. (It needs a server, so it is
// compiled, not run.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("FENCE_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backend, err := pglease.New(pool, pglease.WithSchema("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	m, err := lease.NewManager(backend, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Check(ctx); err != nil {
		log.Fatal(err) // e.g. tables missing: the error says to run fencekit migrate up
	}
	err = m.Run(ctx, "nightly-invoices", func(ctx context.Context, l *lease.Lease) error {
		// Work under ctx; present l.Token() to every fenced write.
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Session mode: an advisory lock on a connection pinned for the lease's
// life, ended at once when the session dies. It refuses a transaction-mode
// pooler in front of the server (pglease.ErrPooler).
func Example_sessionMode() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("FENCE_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backend, err := pglease.New(pool, pglease.WithMode(pglease.ModeSession))
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	m, err := lease.NewManager(backend, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	l, err := m.TryAcquire(ctx, "schema-migration")
	if err != nil {
		log.Fatal(err) // lease.ErrNotAcquired: another process holds it
	}
	defer l.Release(context.Background())
}
