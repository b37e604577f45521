package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/pglease/internal/pgtest"
)

var modes = []pglease.Mode{pglease.ModeTable, pglease.ModeSession}

// renewLog records the send time of the last request the store confirmed
// for each lease: the acquire's (set by the test) or a renewal's; and that
// of the last renew request, whatever its outcome.
type renewLog struct {
	lease.NopObserver
	mu    sync.Mutex
	last  map[string]time.Time
	tried map[string]time.Time
	lost  map[string]time.Time // when the Manager ended the lease (just before it cancels its context)
}

func newRenewLog() *renewLog {
	return &renewLog{last: map[string]time.Time{}, tried: map[string]time.Time{}, lost: map[string]time.Time{}}
}

func (r *renewLog) Lost(e lease.LostEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost[e.Name] = time.Now()
}

func (r *renewLog) lostAt(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost[name]
}

func (r *renewLog) Renewed(e lease.RenewedEvent) {
	r.mu.Lock()
	if e.Sent.After(r.tried[e.Name]) {
		r.tried[e.Name] = e.Sent
	}
	r.mu.Unlock()
	if e.Err == nil {
		r.set(e.Name, e.Sent)
	}
}

// lastTried returns when the last renew request for name was sent.
func (r *renewLog) lastTried(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tried[name]
}

func (r *renewLog) set(name string, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sent.After(r.last[name]) {
		r.last[name] = sent
	}
}

func (r *renewLog) get(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[name]
}

// holders acquires n leases through m, recording each acquire's send time.
func holders(t *testing.T, m *lease.Manager, log *renewLog, base string, n int) []*lease.Lease {
	t.Helper()
	var ls []*lease.Lease
	for i := range n {
		name := fmt.Sprintf("%s-%d", base, i)
		sent := time.Now()
		l, err := m.TryAcquire(testkit.Context(t), name)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", name, err)
		}
		log.set(name, sent)
		ls = append(ls, l)
	}
	return ls
}

// waitLost waits for every lease to end and checks that each one's local
// deadline came before the TTL had passed since the last confirmed request
// was sent, and that the Manager ended it (and cancelled its context) by
// that deadline, within a late timer's slack; it returns when each ended,
// after start.
func waitLost(t *testing.T, ls []*lease.Lease, log *renewLog, ttl time.Duration, start time.Time) []time.Duration {
	t.Helper()
	var after []time.Duration
	for _, l := range ls {
		select {
		case <-l.Done():
		case <-time.After(ttl + 10*time.Second):
			t.Fatalf("%s: not lost %v after the fault", l.Name(), ttl+10*time.Second)
		}
		lostAt := log.lostAt(l.Name())
		last := log.get(l.Name())
		// The deadline is the rule (no timing involved); the Manager's
		// timer that ends the lease may run late on a loaded machine.
		if dl := l.Deadline(); !dl.Before(last.Add(ttl)) {
			t.Errorf("%s: local deadline %v after the last confirmed request was sent; must be before the TTL %v", l.Name(), dl.Sub(last), ttl)
		} else if late := lostAt.Sub(dl); late > leasetest.LateTimerSlack {
			t.Errorf("%s: ended %v after its local deadline; allowed %v for a late timer", l.Name(), late, leasetest.LateTimerSlack)
		}
		if !errors.Is(l.Err(), lease.ErrLost) {
			t.Errorf("%s: Err = %v, want ErrLost", l.Name(), l.Err())
		}
		after = append(after, lostAt.Sub(start))
	}
	return after
}

// The server stopped (as a crash would) while leases are held: each holder
// learns the loss by its deadline (session mode: from the broken
// connection, before its deadline), and once the server is back the leases
// are granted again with greater tokens.
func TestServerRestartWhileHeld(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			c := pgtest.Start(t)
			schema := newSchema(t, c.URL)
			// Table mode learns the loss from its deadline, a TTL after
			// its last renewal; session mode from the broken connection,
			// which the test tells by the loss's reason (pushed, not
			// expired) and by no renew request having been sent since
			// the stop (a renewal would also find the session gone). Its
			// TTL is long so that a starved socket watcher still reports
			// before the next renewal (in TTL/3) or the deadline would.
			ttl := time.Second
			if mode == pglease.ModeSession {
				ttl = 9 * time.Second
			}
			log := newRenewLog()
			b := newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(mode))
			// A tenth of the TTL between the local deadline and the
			// store's expiry (the acquire's send time is recorded just
			// before the call, a little early).
			m := testkit.NewManager(t, b, ttl, lease.WithObserver(log), lease.WithSafetyMargin(ttl/10))
			ls := holders(t, m, log, "restart", 3)
			time.Sleep(time.Second / 2) // a renewal or two (table mode)

			stopped := time.Now()
			c.Stop()
			after := waitLost(t, ls, log, ttl, stopped)
			t.Logf("%s: lost %v after the server stopped", mode, after)
			if mode == pglease.ModeSession {
				for i, l := range ls {
					var le *lease.LostError
					if !errors.As(l.Err(), &le) || le.Reason != lease.LostTakenOver {
						t.Errorf("%s: session-mode lease lost %v after the server stopped with %v; want a loss pushed by the broken connection (%q), not its deadline passing", l.Name(), after[i], l.Err(), lease.LostTakenOver)
					}
					if tried := log.lastTried(l.Name()); tried.After(stopped) {
						t.Errorf("%s: a renew request was sent %v after the server stopped, before the loss (%v after): the broken connection did not end the lease by itself", l.Name(), tried.Sub(stopped), after[i])
					}
				}
			}
			time.Sleep(ttl) // past every grant's TTL at the store
			c.StartAgain()

			other := testkit.NewManager(t, newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(mode)), ttl)
			for _, l := range ls {
				l2, err := other.Acquire(testkit.Context(t), l.Name())
				if err != nil {
					t.Fatalf("Acquire(%q) after the restart: %v", l.Name(), err)
				}
				if l2.Token() <= l.Token() {
					t.Errorf("%s: token %d after the restart, not greater than %d before", l.Name(), l2.Token(), l.Token())
				}
				if err := l.Release(testkit.Context(t)); !errors.Is(err, lease.ErrLost) {
					t.Errorf("%s: Release of the lost lease = %v, want ErrLost", l.Name(), err)
				}
				if err := l2.Release(testkit.Context(t)); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
}

// The holder's server process killed with pg_terminate_backend. Session
// mode: the lease is lost at once and another holder gets it. Table mode:
// the pool replaces the connection and the lease lives on.
func TestHolderBackendTerminated(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			c := pgtest.Start(t)
			schema := newSchema(t, c.URL)
			const ttl = 10 * time.Second
			pool := newPool(t, c.URL)
			b := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			m := testkit.NewManager(t, b, ttl, lease.WithRenewInterval(time.Second))
			l, err := m.TryAcquire(testkit.Context(t), "terminated")
			if err != nil {
				t.Fatal(err)
			}
			var pids []uint32
			if mode == pglease.ModeSession {
				pids = b.PinnedPIDsForTest()
			} else {
				pids = poolPIDs(t, c.URL)
			}
			killed := time.Now()
			terminate(t, c.URL, pids)

			other := testkit.NewManager(t, newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(mode)), ttl)
			if mode == pglease.ModeTable {
				time.Sleep(2500 * time.Millisecond) // two renewals, on new connections
				if err := l.Err(); err != nil {
					t.Fatalf("table-mode lease ended when its pool's connections were terminated: %v", err)
				}
				if _, err := other.TryAcquire(testkit.Context(t), "terminated"); !errors.Is(err, lease.ErrNotAcquired) {
					t.Fatalf("another holder's TryAcquire = %v, want ErrNotAcquired", err)
				}
				if err := l.Release(testkit.Context(t)); err != nil {
					t.Fatalf("Release: %v", err)
				}
				return
			}
			select {
			case <-l.Done():
			case <-time.After(ttl / 2):
				t.Fatalf("session-mode lease not lost %v after its server process was terminated", ttl/2)
			}
			t.Logf("lost %v after pg_terminate_backend", time.Since(killed))
			var le *lease.LostError
			if !errors.As(l.Err(), &le) || le.Reason != lease.LostTakenOver {
				t.Fatalf("Err = %v, want a pushed loss (taken over)", l.Err())
			}
			// The holder, told of the loss, then marks the token row free
			// (through another connection, just after Done): the other
			// holder gets the name without waiting out its expiry.
			actx, cancel := context.WithTimeout(testkit.Context(t), ttl/2)
			defer cancel()
			l2, err := other.Acquire(actx, "terminated")
			if err != nil {
				t.Fatalf("another holder cannot acquire within %v after the holder's session was terminated: %v", ttl/2, err)
			}
			if l2.Token() <= l.Token() {
				t.Fatalf("token %d after %d", l2.Token(), l.Token())
			}
			if err := l2.Release(testkit.Context(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// poolPIDs returns the server processes of every client connection but the
// caller's own.
func poolPIDs(t *testing.T, url string) []uint32 {
	t.Helper()
	conn := connectT(t, url)
	rows, err := conn.Query(testkit.Context(t), `SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	var pids []uint32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, uint32(pid))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// The whole server frozen with SIGSTOP for longer than the TTL: the
// holder's context is cancelled before the TTL has passed since the last
// request the store confirmed was sent; once the server continues, another
// holder gets the lease with a greater token.
func TestServerPausedPastTTL(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			c := pgtest.Start(t)
			schema := newSchema(t, c.URL)
			// Table mode learns the loss from its deadline, a TTL after
			// its last renewal; session mode from the broken connection,
			// which the test tells by the loss's reason (pushed, not
			// expired) and by no renew request having been sent since
			// the stop (a renewal would also find the session gone). Its
			// TTL is long so that a starved socket watcher still reports
			// before the next renewal (in TTL/3) or the deadline would.
			ttl := time.Second
			if mode == pglease.ModeSession {
				ttl = 9 * time.Second
			}
			log := newRenewLog()
			b := newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(mode))
			m := testkit.NewManager(t, b, ttl, lease.WithObserver(log), lease.WithSafetyMargin(ttl/10))
			ls := holders(t, m, log, "paused", 2)
			time.Sleep(ttl / 2)

			paused := time.Now()
			c.Pause()
			after := waitLost(t, ls, log, ttl, paused)
			t.Logf("%s: lost %v after the pause", mode, after)
			time.Sleep(ttl)
			c.Resume()

			other := testkit.NewManager(t, newBackend(t, newPool(t, c.URL), pglease.WithSchema(schema), pglease.WithMode(mode)), ttl)
			for _, l := range ls {
				l2, err := other.Acquire(testkit.Context(t), l.Name())
				if err != nil {
					t.Fatalf("Acquire(%q) after the pause: %v", l.Name(), err)
				}
				if l2.Token() <= l.Token() {
					t.Errorf("%s: token %d after the pause, not greater than %d", l.Name(), l2.Token(), l.Token())
				}
				_ = l.Release(testkit.Context(t))
				if err := l2.Release(testkit.Context(t)); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
}
