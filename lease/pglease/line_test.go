package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
)

// The line of waiters (driver.Request.Queue) at the store, in both modes:
// these tests look at the waiters' table itself, besides the grants and
// refusals.

// lineStore is one throwaway schema with a connection to read its line.
type lineStore struct {
	t      *testing.T
	url    string
	schema string
	mode   pglease.Mode
	conn   *pgx.Conn
	pool   *pgxpool.Pool
}

func newLineStore(t *testing.T, mode pglease.Mode) *lineStore {
	url := testenv.PostgresURL()
	schema := newSchema(t, url)
	return &lineStore{t: t, url: url, schema: schema, mode: mode, conn: connectT(t, url), pool: newPool(t, url)}
}

// backend returns a new Backend on the store (a process of its own).
func (s *lineStore) backend() *pglease.Backend {
	return newBackend(s.t, s.pool, pglease.WithSchema(s.schema), pglease.WithMode(s.mode))
}

func (s *lineStore) waiters() string {
	if s.mode == pglease.ModeSession {
		return pgx.Identifier{s.schema, pglease.SessionWaiterTable}.Sanitize()
	}
	return pgx.Identifier{s.schema, pglease.WaiterTable}.Sanitize()
}

// line returns the owners with a row in name's line, in line order, lapsed
// places included, places marked ended by an Abandon not.
func (s *lineStore) line(name string) []string {
	s.t.Helper()
	rows, err := s.conn.Query(testkit.Context(s.t), `SELECT owner FROM `+s.waiters()+` WHERE name = $1 AND ended_until <= clock_timestamp() ORDER BY seq`, name)
	if err != nil {
		s.t.Fatal(err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		s.t.Fatal(err)
	}
	return owners
}

// lapsed reports whether owner's place in name's line has lapsed by the
// server's clock (true when it has no row).
func (s *lineStore) lapsed(name, owner string) bool {
	s.t.Helper()
	var ok bool
	err := s.conn.QueryRow(testkit.Context(s.t), `SELECT coalesce((SELECT expires_at <= clock_timestamp() FROM `+s.waiters()+` WHERE name = $1 AND owner = $2), true)`, name, owner).Scan(&ok)
	if err != nil {
		s.t.Fatal(err)
	}
	return ok
}

func queuedReq(name, owner string, ttl time.Duration) driver.Request {
	return driver.Request{Name: name, Owner: owner, TTL: ttl, Queue: true}
}

// refused sends r and requires a refusal; it returns the refusal's
// NotAcquiredError (nil for the refusal of an ended owner).
func refused(t *testing.T, b *pglease.Backend, r driver.Request, why string) *driver.NotAcquiredError {
	t.Helper()
	g, err := b.Acquire(testkit.Context(t), r)
	if err == nil {
		t.Fatalf("%s: Acquire(%q, %q, queue %v) granted token %d, want a refusal", why, r.Name, r.Owner, r.Queue, g.Token)
	}
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("%s: Acquire(%q, %q) = %v, want ErrNotAcquired", why, r.Name, r.Owner, err)
	}
	var na *driver.NotAcquiredError
	if errors.As(err, &na) {
		return na
	}
	return nil
}

func granted(t *testing.T, b *pglease.Backend, r driver.Request, why string) driver.Grant {
	t.Helper()
	g, err := b.Acquire(testkit.Context(t), r)
	if err != nil {
		t.Fatalf("%s: Acquire(%q, %q, queue %v) = %v, want a grant", why, r.Name, r.Owner, r.Queue, err)
	}
	return g
}

func released(t *testing.T, b *pglease.Backend, g driver.Grant) {
	t.Helper()
	if err := b.Release(testkit.Context(t), g); err != nil {
		t.Fatalf("Release(%q, %q): %v", g.Name, g.Owner, err)
	}
}

// Waiters that joined behind a holder are in the table in the order they
// came (asking again keeps a place), each one that is not first is
// refused with how many are ahead while the name is free, and they are
// granted in that order, each grant taking its owner out of the line.
func TestLineOrderAtTheStore(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s := newLineStore(t, mode)
			const name = "order"
			hb := s.backend()
			h := granted(t, hb, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second}, "the holder")
			owners := []string{"w-c", "w-a", "w-d", "w-b"} // arrival order, not the owners' order
			bs := make([]*pglease.Backend, len(owners))
			for i, o := range owners {
				bs[i] = s.backend()
				na := refused(t, bs[i], queuedReq(name, o, 10*time.Second), "joining behind the holder")
				if na == nil || na.Ahead != 0 {
					t.Fatalf("%s's refusal while the name is held = %#v, want a NotAcquiredError without Ahead", o, na)
				}
				if mode == pglease.ModeTable && na.RetryAfter <= 0 {
					t.Fatalf("%s's refusal while the name is held has no RetryAfter", o)
				}
			}
			for i := len(owners) - 1; i >= 0; i-- {
				refused(t, bs[i], queuedReq(name, owners[i], 10*time.Second), "asking again")
			}
			if got := s.line(name); !slices.Equal(got, owners) {
				t.Fatalf("line %v, want %v", got, owners)
			}
			last := h.Token
			released(t, hb, h)
			for k, o := range owners {
				for j := len(owners) - 1; j > k; j-- {
					na := refused(t, bs[j], queuedReq(name, owners[j], 10*time.Second), fmt.Sprintf("behind %s", o))
					if na == nil || na.Ahead != j-k || na.RetryAfter <= 0 || na.RetryAfter > 10*time.Second {
						t.Fatalf("%s's refusal while the name is kept for %s = %#v, want Ahead %d and the first place's time left", owners[j], o, na, j-k)
					}
				}
				g := granted(t, bs[k], queuedReq(name, o, 10*time.Second), "first in line")
				if g.Token <= last {
					t.Fatalf("%s granted token %d after token %d", o, g.Token, last)
				}
				last = g.Token
				if got := s.line(name); !slices.Equal(got, owners[k+1:]) {
					t.Fatalf("line after %s's grant: %v, want %v", o, got, owners[k+1:])
				}
				released(t, bs[k], g)
			}
		})
	}
}

// A waiter that gave up (Abandon) and one that died (its place lapses)
// do not hold up the waiter behind them; the one that gave up is refused
// and never put in line again; a lapsed place is deleted by the next
// queued acquire.
func TestLineAbandonedAndLapsedPlaces(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s := newLineStore(t, mode)
			const name = "gone"
			hb, quitter, dead, live := s.backend(), s.backend(), s.backend(), s.backend()
			h := granted(t, hb, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second}, "the holder")
			rq, rd, rl := queuedReq(name, "quitter", 10*time.Second), queuedReq(name, "dead", time.Second), queuedReq(name, "live", 10*time.Second)
			refused(t, quitter, rq, "the first waiter")
			refused(t, dead, rd, "the second waiter")
			refused(t, live, rl, "the third waiter")
			if got := s.line(name); !slices.Equal(got, []string{"quitter", "dead", "live"}) {
				t.Fatalf("line %v", got)
			}
			if err := quitter.Abandon(testkit.Context(t), rq); err != nil {
				t.Fatal(err)
			}
			if got := s.line(name); !slices.Equal(got, []string{"dead", "live"}) {
				t.Fatalf("line after the first waiter's Abandon: %v, want [dead live]", got)
			}
			if na := refused(t, quitter, rq, "an abandoned waiter asking again"); na != nil {
				t.Fatalf("an abandoned waiter's refusal = %v, want the ended owner's", na)
			}
			if got := s.line(name); !slices.Equal(got, []string{"dead", "live"}) {
				t.Fatalf("line after the abandoned waiter asked again: %v, want [dead live]", got)
			}
			released(t, hb, h)
			// While the dead waiter's place lives, the name is kept for it
			// (unless this goroutine was delayed past its TTL).
			g, err := live.Acquire(testkit.Context(t), rl)
			if err == nil && !s.lapsed(name, "dead") {
				t.Fatal("the live waiter was granted the name while the dead waiter's place ahead of it was live")
			}
			if err != nil {
				if na := refused(t, live, rl, "the live waiter behind the dead one's place"); na == nil || na.Ahead != 1 {
					if !s.lapsed(name, "dead") {
						t.Fatalf("the live waiter's refusal behind a live place = %#v, want Ahead 1", na)
					}
				}
				for !s.lapsed(name, "dead") {
					time.Sleep(50 * time.Millisecond)
				}
				g = granted(t, live, rl, "the waiter behind a place that lapsed")
			}
			if got := s.line(name); len(got) != 0 {
				t.Fatalf("line after the last waiter's grant: %v, want it empty (the lapsed place deleted)", got)
			}
			// Back too late, the dead waiter joins the end of the line.
			refused(t, dead, rd, "the dead waiter back after its place lapsed")
			if got := s.line(name); !slices.Equal(got, []string{"dead"}) {
				t.Fatalf("line %v, want [dead]", got)
			}
			released(t, live, g)
		})
	}
}

// A holder that crashed (table mode: it stops renewing; session mode: its
// session ends on the server) does not leave the line stuck: once its
// grant has run out, the first waiter is granted, and only then the
// second.
func TestLineAfterHolderCrash(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s := newLineStore(t, mode)
			const name = "crash"
			const ttl = 500 * time.Millisecond
			hb := s.backend()
			h := granted(t, hb, driver.Request{Name: name, Owner: "crashed", TTL: ttl}, "the holder")
			w0, w1 := s.backend(), s.backend()
			r0, r1 := queuedReq(name, "first", 10*time.Second), queuedReq(name, "second", 10*time.Second)
			refused(t, w0, r0, "the first waiter")
			refused(t, w1, r1, "the second waiter")
			if mode == pglease.ModeSession {
				terminate(t, s.url, hb.PinnedPIDsForTest())
			}
			deadline := time.Now().Add(10*ttl + 10*time.Second)
			var g driver.Grant
			for {
				refused(t, w1, r1, "the second waiter while the first waits")
				var err error
				g, err = w0.Acquire(testkit.Context(t), r0)
				if err == nil {
					break
				}
				if !errors.Is(err, lease.ErrNotAcquired) || time.Now().After(deadline) {
					t.Fatalf("the first waiter, after the holder (TTL %v) crashed: %v", ttl, err)
				}
				time.Sleep(ttl / 10)
			}
			if g.Token <= h.Token {
				t.Fatalf("token %d after the crashed holder's %d", g.Token, h.Token)
			}
			refused(t, w1, r1, "the second waiter while the first holds")
			released(t, w0, g)
			g1 := granted(t, w1, r1, "the second waiter after the first released")
			if g1.Token <= g.Token {
				t.Fatalf("token %d after %d", g1.Token, g.Token)
			}
			released(t, w1, g1)
		})
	}
}

// Acquire without Queue (TryAcquire, a Manager without FIFO) ignores the
// line: it takes a free name ahead of the waiters, who keep their places
// and are granted, in order, after it.
func TestLineUnqueuedAcquireIgnoresIt(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			s := newLineStore(t, mode)
			const name = "jump"
			hb, wb := s.backend(), s.backend()
			h := granted(t, hb, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second}, "the holder")
			rw := queuedReq(name, "waiter", 10*time.Second)
			refused(t, wb, rw, "the waiter")
			released(t, hb, h)
			m := testkit.NewManager(t, s.backend(), 10*time.Second, lease.WithIdentity("jumper"))
			l, err := m.TryAcquire(testkit.Context(t), name)
			if err != nil {
				t.Fatalf("TryAcquire of a free name with a waiter in line: %v", err)
			}
			if l.Token() <= h.Token {
				t.Fatalf("token %d after %d", l.Token(), h.Token)
			}
			refused(t, wb, rw, "the waiter while the one that jumped the line holds")
			if got := s.line(name); len(got) != 1 {
				t.Fatalf("line %v, want the waiter alone", got)
			}
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatal(err)
			}
			g := granted(t, wb, rw, "the waiter after the release")
			if g.Token <= l.Token() {
				t.Fatalf("token %d after %d", g.Token, l.Token())
			}
			released(t, wb, g)
		})
	}
}

// A queued acquire is one round trip, refused or granted, in both modes
// (once pgx has prepared its statement on the connection).
func TestLineRoundTrips(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			schema := newSchema(t, url)
			var writes atomic.Int64
			pool := newPool(t, url, func(c *pgxpool.Config) {
				c.MaxConns = 2
				d := &net.Dialer{}
				c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					conn, err := d.DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &countingConn{Conn: conn, n: &writes}, nil
				}
			})
			b := newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode))
			wb := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			cycle := func(name string) (refusal, grant int64) {
				h := granted(t, b, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second}, "the holder")
				r := queuedReq(name, "waiter", 10*time.Second)
				n := writes.Load()
				refused(t, wb, r, "the waiter")
				refusal, n = writes.Load()-n, writes.Load()
				released(t, b, h)
				g := granted(t, wb, r, "the waiter")
				grant = writes.Load() - n
				released(t, wb, g)
				return refusal, grant
			}
			cycle("warm") // prepares the statements
			if r, g := cycle("counted"); r != 1 || g != 1 {
				t.Fatalf("round trips of a queued acquire: refused %d, granted %d; want 1 each", r, g)
			}
		})
	}
}

// A queued refusal commits without waiting for the WAL flush, for its own
// transaction only: the connection it ran on (given back to the pool)
// keeps the session's synchronous_commit, so later grants on it are
// durable.
func TestLineRefusalLeavesTheSessionSetting(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			schema := newSchema(t, url)
			pool := newPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 1 })
			hb := newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode))
			wb := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			var before string
			if err := pool.QueryRow(testkit.Context(t), "SHOW synchronous_commit").Scan(&before); err != nil {
				t.Fatal(err)
			}
			if before == "off" {
				t.Fatal("the server's synchronous_commit is off: the check cannot tell")
			}
			h := granted(t, hb, driver.Request{Name: "sync", Owner: "holder", TTL: 10 * time.Second}, "the holder")
			r := queuedReq("sync", "waiter", 10*time.Second)
			refused(t, wb, r, "the waiter")
			refused(t, wb, r, "the waiter again")
			var after string
			if err := pool.QueryRow(testkit.Context(t), "SHOW synchronous_commit").Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Fatalf("synchronous_commit on the waiter's connection after its refusals: %q, was %q", after, before)
			}
			released(t, hb, h)
			released(t, wb, granted(t, wb, r, "the waiter"))
		})
	}
}

// An abandoned waiter's queued acquire that reaches the store before its
// Abandon but commits after it (it waited for the lease row's lock with a
// snapshot from before the Abandon) leaves no place behind: the Abandon
// of a queued request marks the place ended, in the waiters' table itself,
// where the late statement's INSERT ... ON CONFLICT reads the newest row.
func TestLineAbandonRacingItsAcquire(t *testing.T) {
	s := newLineStore(t, pglease.ModeTable)
	const name = "race"
	hb, wb := s.backend(), s.backend()
	h := granted(t, hb, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second}, "the holder")
	ctx := testkit.Context(t)
	// Hold the lease row's lock, so that the waiter's statement, which
	// tries the grant (no one is ahead of it), waits for it.
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{s.schema, pglease.LeaseTable}.Sanitize()+` WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		t.Helper()
		admin := connectT(t, s.url)
		for {
			var got int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, s.schema).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	r := queuedReq(name, "waiter", 10*time.Second)
	acquired := make(chan error, 1)
	go func() {
		_, err := wb.Acquire(ctx, r)
		acquired <- err
	}()
	waiting(1)
	abandoned := make(chan error, 1)
	go func() { abandoned <- wb.Abandon(ctx, r) }()
	waiting(2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-acquired; !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("the waiter's acquire = %v, want ErrNotAcquired", err)
	}
	if err := <-abandoned; err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	if !s.lapsed(name, "waiter") {
		t.Fatalf("the abandoned waiter has a live place in line %v", s.line(name))
	}
	// The waiter behind it is next at once.
	nb := s.backend()
	rn := queuedReq(name, "next", 10*time.Second)
	refused(t, nb, rn, "the next waiter")
	released(t, hb, h)
	released(t, nb, granted(t, nb, rn, "the next waiter after the release"))
}
