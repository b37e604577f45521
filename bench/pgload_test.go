package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cirello.io/pglock"

	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/pglease"
)

// BenchmarkPGThroughput is acquire + release throughput on the shared
// PostgreSQL: workers goroutines, each looping a blocking acquire and a
// release, b.N cycles in all (run it with a fixed count: -benchtime 2000x).
//
//   - names=distinct: each worker on a name of its own (no contention:
//     what the store and the pool sustain).
//   - names=one: every worker on one name (hand-overs: what a contended
//     lock sustains). pglock is left out: its waiters sleep a whole lease
//     duration between attempts (see BenchmarkPGHandoff).
//
// lib=fencekit-table and lib=fencekit-session: lease.Manager.Acquire +
// Lease.Release over pglease (TTL 10 s; waiters woken by LISTEN/NOTIFY).
// Session mode pins a connection per held lease, so at most 16 leases are
// held at once. lib=pglock: cirello.io/pglock AcquireContext +
// ReleaseContext (10 s lease), with SetMaxOpenConns(16).
//
// Metrics: ops/s, cycles per second of wall time; p50-ns and p99-ns of a
// cycle (from the acquire call to the release's return, waits included).
func BenchmarkPGThroughput(b *testing.B) {
	s := newPGSetup(b)
	ctx := context.Background()
	manager := func(mode pglease.Mode) func(string) error {
		m, err := lease.NewManager(newPGBackend(b, s, mode), benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		return func(name string) error {
			l, err := m.Acquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	pl, db := s.newPglockDB(b, benchTTL, pglock.DefaultHeartbeatFrequency)
	db.SetMaxOpenConns(16)
	libs := []struct {
		name  string
		cycle func(name string) error
	}{
		{"fencekit-table", manager(pglease.ModeTable)},
		{"fencekit-session", manager(pglease.ModeSession)},
		{"pglock", func(name string) error {
			l, err := pl.AcquireContext(ctx, name)
			if err != nil {
				return err
			}
			return pl.ReleaseContext(ctx, l)
		}},
	}
	for _, lib := range libs {
		// pglock's waiters sleep a whole lease duration between attempts.
		pairbench.ThroughputRuns(b, "lib="+lib.name, lib.name != "pglock", lib.cycle)
	}
}

// BenchmarkPGRenewLoad is the write load of keeping leases alive: held
// leases, each renewed by one lease.Manager with its defaults (TTL 15 s:
// a renewal every (TTL - safety margin)/3), over a window of b.N seconds
// (run it with -benchtime 10x). Table mode holds 1,000 leases, renewed in
// batches (one UPDATE per batch); session mode holds 14 (each pins one of
// the pool's 16 connections, beside the listener's), each renewed on its
// own connection.
//
// Metrics, per 1,000 held leases: stmts/s, the statements (round trips)
// the server receives per second; rows/s, the lease rows renewals write
// per second (each a commit in session mode, one per batch in table
// mode). Compare client-go's leader election with its defaults: one
// update of the Lease object every RetryPeriod (2 s), 500 requests/s and
// 500 writes/s per 1,000 held leases.
func BenchmarkPGRenewLoad(b *testing.B) {
	s := newPGSetup(b)
	ctx := context.Background()
	for _, c := range []struct {
		mode   pglease.Mode
		leases int
	}{{pglease.ModeTable, 1000}, {pglease.ModeSession, 14}} {
		b.Run(fmt.Sprintf("mode=%s/leases=%d", c.mode, c.leases), func(b *testing.B) {
			renewals := &pairbench.RenewCounter{}
			m, err := lease.NewManager(newPGBackend(b, s, c.mode), pairbench.RenewTTL, lease.WithObserver(renewals))
			if err != nil {
				b.Fatal(err)
			}
			held := make([]*lease.Lease, 0, c.leases)
			defer func() {
				for _, l := range held {
					_ = l.Release(ctx)
				}
			}()
			// Acquired over one renew interval, as leases taken at random
			// times over a long run would be.
			interval := m.Options().RenewInterval
			for i := range c.leases {
				l, err := m.TryAcquire(ctx, fmt.Sprintf("renew-%s-%d", c.mode, i))
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, l)
				time.Sleep(interval / time.Duration(c.leases))
			}
			rt0, n0 := s.rt.n.Load(), renewals.Load()
			b.ResetTimer()
			time.Sleep(time.Duration(b.N) * time.Second)
			b.StopTimer()
			window := float64(b.N)
			per1000 := 1000 / float64(c.leases)
			for _, l := range held {
				if err := l.Err(); err != nil {
					b.Fatalf("a lease was lost while renewed: %v", err)
				}
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/window*per1000, "stmts/s")
			b.ReportMetric(float64(renewals.Load()-n0)/window*per1000, "rows/s")
		})
	}
}
