package leasetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of waiters in line (driver.Limits.Queues, lease.Options.FIFO):
// order, a waiter that gives up, a waiter that dies, a holder that dies.
// They assert on the order of grants and refusals, not on speed; where a
// place must lapse, they allow three TTLs.

// queued is req with Request.Queue set.
func queued(name, owner string, ttl time.Duration) driver.Request {
	r := req(name, owner, ttl)
	r.Queue = true
	return r
}

// mustWait sends r and requires a refusal (the owner waits in line).
func mustWait(t *testing.T, b lease.Backend, r driver.Request, why string) {
	t.Helper()
	g, err := b.Acquire(ctxT(t), r)
	if err == nil {
		t.Fatalf("%s: Acquire(%q, owner %q, queued) granted token %d, want a refusal", why, r.Name, r.Owner, g.Token)
	}
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("%s: Acquire(%q, owner %q, queued) = %v, want ErrNotAcquired", why, r.Name, r.Owner, err)
	}
}

// testLineOrder: waiters that joined the line while the lease was held get
// it in the order they joined; each one that is not first is refused while
// the name is free, and a waiter asking again keeps its place.
func testLineOrder(t *testing.T, s *suite) {
	b := s.backend()
	s.need(t, Queue, s.limits.Queues)
	n := name(t)
	h := mustAcquire(t, b, req(n, "holder", s.long))
	const waiters = 4
	bs := make([]lease.Backend, waiters)
	rs := make([]driver.Request, waiters)
	for i := range waiters {
		bs[i], rs[i] = s.connect(), queued(n, fmt.Sprintf("waiter-%d", i), s.long)
		mustWait(t, bs[i], rs[i], fmt.Sprintf("waiter %d joining while the lease is held", i))
	}
	// Asking again, out of order, keeps each place.
	for i := waiters - 1; i >= 0; i-- {
		mustWait(t, bs[i], rs[i], fmt.Sprintf("waiter %d asking again while the lease is held", i))
	}
	last := h.Token
	release(t, b, h)
	for k := range waiters {
		for j := waiters - 1; j > k; j-- {
			mustWait(t, bs[j], rs[j], fmt.Sprintf("waiter %d while waiter %d is first in line", j, k))
		}
		g := mustAcquire(t, bs[k], rs[k])
		if g.Token <= last {
			t.Fatalf("waiter %d granted token %d after token %d", k, g.Token, last)
		}
		// Asked again by its holder, the grant is the same (a retried request).
		if again := mustAcquire(t, bs[k], rs[k]); again.Token != g.Token {
			t.Fatalf("waiter %d asking again got token %d, then %d", k, g.Token, again.Token)
		}
		last = g.Token
		release(t, bs[k], g)
	}
	// The line is empty: a new waiter is granted at once.
	release(t, b, mustAcquire(t, b, queued(n, "late", s.long)))
}

// testLineAbandon: a waiter that gave up (Abandon) leaves the line at once,
// and its acquire request, arriving after the Abandon, neither is granted
// nor takes a place again.
func testLineAbandon(t *testing.T, s *suite) {
	b := s.backend()
	s.need(t, Queue, s.limits.Queues)
	n := name(t)
	h := mustAcquire(t, b, req(n, "holder", s.long))
	gone, next := s.connect(), s.connect()
	rg, rn := queued(n, "gave-up", s.long), queued(n, "next", s.long)
	mustWait(t, gone, rg, "the first waiter")
	if err := gone.Abandon(ctxT(t), rg); err != nil {
		t.Fatalf("Abandon of a waiter: %v", err)
	}
	mustWait(t, gone, rg, "a waiter's acquire request arriving after its Abandon")
	mustWait(t, next, rn, "the waiter that joined after the one that gave up")
	release(t, b, h)
	g := mustAcquire(t, next, rn) // refused if the abandoned place were still ahead
	if g.Token <= h.Token {
		t.Fatalf("token %d after token %d", g.Token, h.Token)
	}
	// The first of two waiters gives up while the name is free and kept
	// for it: the second is granted at once.
	third, fourth := s.connect(), s.connect()
	r3, r4 := queued(n, "third", s.long), queued(n, "fourth", s.long)
	mustWait(t, third, r3, "the third waiter")
	mustWait(t, fourth, r4, "the fourth waiter")
	release(t, next, g)
	mustWait(t, fourth, r4, "the fourth waiter while the third is first")
	if err := third.Abandon(ctxT(t), r3); err != nil {
		t.Fatalf("Abandon of the first waiter: %v", err)
	}
	release(t, fourth, mustAcquire(t, fourth, r4))
}

// testLineDeadWaiter: a waiter that stops asking (its process died) keeps
// its place for its TTL, then leaves the line by itself, and the waiter
// behind it gets the lease.
func testLineDeadWaiter(t *testing.T, s *suite) {
	b := s.backend()
	s.need(t, Queue, s.limits.Queues)
	n := name(t)
	h := mustAcquire(t, b, req(n, "holder", s.long))
	dead, live := s.connect(), s.connect()
	rd, rl := queued(n, "dead", s.short), queued(n, "live", s.long)
	joined := time.Now()
	mustWait(t, dead, rd, "the waiter that will die")
	mustWait(t, live, rl, "the waiter behind it")
	release(t, b, h)
	// While the dead waiter's place lives, the name is kept for it. (Only
	// checked when this goroutine was not delayed past half its TTL.)
	g, err := live.Acquire(ctxT(t), rl)
	if err == nil {
		if time.Since(joined) < s.short/2 {
			t.Fatalf("the second waiter was granted token %d %v after the first joined the line with a TTL of %v", g.Token, time.Since(joined), s.short)
		}
		release(t, live, g)
		return
	}
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("the second waiter's Acquire = %v, want ErrNotAcquired", err)
	}
	deadline := joined.Add(3*s.short + time.Second)
	for {
		time.Sleep(s.short / 10)
		g, err = live.Acquire(ctxT(t), rl)
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("the second waiter, %v after a waiter with a TTL of %v stopped asking: %v", time.Since(joined), s.short, err)
		}
	}
	// The dead waiter, back too late, finds the lease held.
	mustWait(t, dead, rd, "the dead waiter back after its place lapsed")
	release(t, live, g)
}

// lineSpy tells, per owner, when a queued acquire was first refused: the
// owner then has its place in line.
type lineSpy struct {
	lease.Backend
	mu     sync.Mutex
	inLine map[string]chan struct{} // by the Manager's Identity
}

func newLineSpy(b lease.Backend) lease.Backend {
	s := &lineSpy{Backend: b, inLine: map[string]chan struct{}{}}
	if w, ok := b.(driver.Watcher); ok {
		return &lineSpyWatch{s, w}
	}
	return s
}

type lineSpyWatch struct {
	*lineSpy
	driver.Watcher
}

func spyOf(b lease.Backend) *lineSpy {
	if w, ok := b.(*lineSpyWatch); ok {
		return w.lineSpy
	}
	return b.(*lineSpy)
}

// joined returns a channel closed once identity's Acquire has its place.
func (s *lineSpy) joined(identity string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.inLine[identity]
	if !ok {
		ch = make(chan struct{})
		s.inLine[identity] = ch
	}
	return ch
}

func (s *lineSpy) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	g, err := s.Backend.Acquire(ctx, r)
	if r.Queue && errors.Is(err, lease.ErrNotAcquired) {
		ch := s.joined(driver.Holder{Owner: r.Owner}.Identity())
		s.mu.Lock()
		select {
		case <-ch:
		default:
			close(ch)
		}
		s.mu.Unlock()
	}
	return g, err
}

// startWaiter starts the Acquire of n by a FIFO Manager with the identity
// "waiter-i" on a connection of its own, bounded by wctx, hands its
// outcome to got on another goroutine (counted in wg), and returns once
// the waiter has its place in line.
func startWaiter(t *testing.T, s *suite, ctx, wctx context.Context, n string, i int, wg *sync.WaitGroup, got func(*lease.Lease, error)) {
	t.Helper()
	spy := newLineSpy(s.connect())
	id := fmt.Sprintf("waiter-%d", i)
	m := newManager(t, spy, s.long, lease.WithFIFO(), lease.WithIdentity(id))
	wg.Go(func() {
		l, err := m.Acquire(wctx, n)
		got(l, err)
	})
	select {
	case <-spyOf(spy).joined(id):
	case <-ctx.Done():
		t.Fatalf("waiter %d did not join the line", i)
	}
}

// testManagerFIFO: FIFO Managers, each on its own connection, block in
// turn behind a holder; one of them gives up (its context ends). When the
// holder releases, the others get the lease in the order they joined, and
// the one that gave up does not hold up those behind it: its place would
// outlive the check (the TTL is LongTTL), so only its Abandon can free it.
func testManagerFIFO(t *testing.T, s *suite) {
	if !s.limits.Queues {
		s.need(t, Queue, false)
	}
	n := name(t)
	holder, err := newManager(t, s.backend(), s.long).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	const waiters, quitter = 4, 1
	ctx, cancel := context.WithTimeout(context.Background(), s.long/2)
	defer cancel()
	var (
		mu     sync.Mutex
		order  []int
		tokens []fence.Token
		wg     sync.WaitGroup
	)
	quitCtx, quit := context.WithCancel(ctx)
	defer quit()
	errs := make(chan error, waiters)
	quitterDone := make(chan struct{})
	for i := range waiters {
		wctx := ctx
		if i == quitter {
			wctx = quitCtx
		}
		startWaiter(t, s, ctx, wctx, n, i, &wg, func(l *lease.Lease, err error) {
			if i == quitter {
				defer close(quitterDone)
				if err == nil {
					l.Release(ctx)
					errs <- fmt.Errorf("waiter %d, cancelled, was granted token %d", i, l.Token())
				}
				return
			}
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order, tokens = append(order, i), append(tokens, l.Token())
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d: Release: %w", i, err)
			}
		})
		if i == quitter+1 {
			// The quitter gives up behind the holder, ahead of this one.
			quit()
		}
	}
	// The quitter's Acquire returns once its Abandon is answered (or has
	// failed, which the check below would show): release after that.
	select {
	case <-quitterDone:
	case <-ctx.Done():
		t.Fatalf("the waiter that gave up had not returned after %v", s.long/2)
	}
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := slices.DeleteFunc([]int{0, 1, 2, 3}, func(i int) bool { return i == quitter })
	if !slices.Equal(order, want) {
		t.Fatalf("waiters granted in the order %v, want %v (the order they joined, without the one that gave up)", order, want)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v do not strictly grow in grant order", tokens)
		}
	}
}

// testLineHolderDies: the holder stops renewing (its process died) while
// FIFO Managers wait: after its TTL the oldest waiter gets the lease, then
// the next; the line does not stay stuck.
func testLineHolderDies(t *testing.T, s *suite) {
	if !s.limits.Queues {
		s.need(t, Queue, false)
	}
	n := name(t)
	b := s.backend()
	h := mustAcquire(t, b, req(n, "crashed", s.short))
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.short+10*time.Second)
	defer cancel()
	// The holder renews until both waiters are in line, then dies: at
	// load, opening a waiter's connection can take longer than the TTL,
	// and the lease would pass to waiter 0 before waiter 1 had joined.
	died := make(chan struct{})
	renewed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(s.short / 5)
		defer tick.Stop()
		for {
			select {
			case <-died:
				renewed <- nil
				return
			case <-tick.C:
				if err := b.Renew(ctx, h); err != nil {
					renewed <- fmt.Errorf("the holder's renewal before both waiters were in line (every %v, TTL %v): %w", s.short/5, s.short, err)
					return
				}
			}
		}
	}()
	granted := make(chan int, 2)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		startWaiter(t, s, ctx, ctx, n, i, &wg, func(l *lease.Lease, err error) {
			if err != nil {
				errs <- fmt.Errorf("waiter %d, after the holder (TTL %v) died: %w", i, s.short, err)
				return
			}
			if l.Token() <= h.Token {
				errs <- fmt.Errorf("waiter %d granted token %d after the dead holder's %d", i, l.Token(), h.Token)
			}
			granted <- i
			if err := l.Release(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d: Release: %w", i, err)
			}
		})
	}
	close(died)
	if err := <-renewed; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(granted)
	var order []int
	for i := range granted {
		order = append(order, i)
	}
	if !slices.Equal(order, []int{0, 1}) {
		t.Fatalf("waiters granted in the order %v after the holder died, want [0 1]", order)
	}
}
