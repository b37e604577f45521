package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// TestTakeoverAfterSIGKILLPostgres is TestTakeoverAfterSIGKILL with the
// lease in PostgreSQL (pglease, both modes), with real holder processes. In
// table mode, as with Redis, the waiter gets the lease once the dead
// holder's row expires, never before; in session mode the dead holder's
// session ends with its process (its socket closes), which frees the lock at
// once, so the waiter gets it at its next poll.
func TestTakeoverAfterSIGKILLPostgres(t *testing.T) {
	const slack = 500 * time.Millisecond
	schema := leaseSchema(t)
	for _, store := range []string{"postgres", "postgres-session"} {
		for _, ttl := range []time.Duration{500 * time.Millisecond, time.Second} {
			name := fmt.Sprintf("takeover-%s-%v", store, ttl)
			t.Run(name, func(t *testing.T) {
				// A holder on a starved machine may lose a short lease on
				// its own (a renewal late past the TTL) before the test
				// kills it; such a trial tests no kill, so it runs again,
				// a bounded number of times, under a fresh lease name.
				const attempts = 5
				for i := range attempts {
					if takeoverTrial(t, store, schema, fmt.Sprintf("%s-%d", name, i), ttl, slack) {
						return
					}
				}
				t.Fatalf("holder A lost its %v lease on its own before the kill in all %d trials: no takeover after SIGKILL was tested", ttl, attempts)
			})
		}
	}
}

// takeoverTrial is one trial of TestTakeoverAfterSIGKILLPostgres. It
// returns false, having checked nothing, when holder A lost its lease
// before the test killed it.
func takeoverTrial(t *testing.T, store, schema, name string, ttl, slack time.Duration) bool {
	t.Helper()
	renew := ttl / 3
	args := []string{"-store", store, "-postgres", testenv.PostgresURL(), "-schema", schema, "-name", name, "-ttl", ttl.String(), "-timeout", "60s"}
	a := itest.StartHolder(t, append(args, "-do", "hold")...)
	acq := a.NextHeld("acquired", 30*time.Second)
	if e, lost := a.Await("renewed", 10*ttl+10*time.Second); lost {
		t.Logf("trial %s: A lost its lease before its first renewal (%s); again", name, e.Text)
		return false
	}
	b := itest.StartHolder(t, args...)
	b.NextHeld("waiting", 30*time.Second)
	time.Sleep(50 * time.Millisecond)
	killed, serr := a.TrySignal(syscall.SIGKILL)
	werr := a.Wait(10 * time.Second)
	if lost := a.Seen("lost"); len(lost) > 0 {
		// A's lease ended before the kill (a killed process reports
		// nothing): B is left to take it over unchecked, and killed
		// with the test.
		t.Logf("trial %s: A lost its lease before the kill (%s); again", name, lost[0].Text)
		return false
	}
	if serr != nil {
		t.Fatalf("holder A: SIGKILL: %v, and it reported no loss: %s", serr, a.History())
	}
	if werr == nil || !strings.Contains(werr.Error(), "killed") {
		t.Fatalf("holder A: want killed by SIGKILL, got exit %v", werr)
	}
	got := b.NextHeld("acquired", 10*ttl+10*time.Second)
	if err := b.Wait(30 * time.Second); err != nil {
		t.Fatalf("process B exited with %v: %s", err, b.History())
	}
	lastSent := a.LastSent(acq)
	took := got.At.Sub(killed)
	afterExpiry := got.At.Sub(lastSent.Add(ttl))
	t.Logf("%s, TTL %v: B acquired (token %d after %d) %v after the kill, %v after A's grant would have expired",
		store, ttl, got.Token, acq.Token, took.Round(time.Millisecond), afterExpiry.Round(time.Millisecond))
	if got.Token <= acq.Token {
		t.Errorf("B's token %d is not greater than A's %d", got.Token, acq.Token)
	}
	if store == "postgres" && afterExpiry < 0 {
		t.Errorf("B acquired %v before the row A last renewed could have expired: exclusivity broken", -afterExpiry)
	}
	if bound := ttl + renew + slack; took > bound {
		t.Errorf("takeover took %v, more than TTL %v + renew interval %v + slack %v", took, ttl, renew, slack)
	}
	return true
}

// leaseSchema creates a schema with fencekit's migrations (pglease's
// tables) on the shared PostgreSQL, dropped when the test ends.
func leaseSchema(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := fmt.Sprintf("it_leases_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, testenv.PostgresURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			c.Close(ctx)
		}
	})
	db, err := migrations.Open(testenv.PostgresURL(), schema)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	return schema
}
