package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

type ctxKey struct{}

// ctxObserver records, per event kind, the value of ctxKey found in each
// event's context, and the order of election events.
type ctxObserver struct {
	mu    sync.Mutex
	seen  map[string][]any
	terms []string // "elected 7", "deposed 7 <err>"
}

func (o *ctxObserver) note(kind string, ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string][]any{}
	}
	o.seen[kind] = append(o.seen[kind], ctx.Value(ctxKey{}))
}

func (o *ctxObserver) Acquired(e lease.AcquiredEvent) { o.note("acquired", e.Ctx) }
func (o *ctxObserver) Renewed(e lease.RenewedEvent)   { o.note("renewed", e.Ctx) }
func (o *ctxObserver) Lost(e lease.LostEvent)         { o.note("lost", e.Ctx) }
func (o *ctxObserver) Released(e lease.ReleasedEvent) { o.note("released", e.Ctx) }
func (o *ctxObserver) Elected(e lease.ElectionEvent) {
	o.note("elected", e.Ctx)
	o.mu.Lock()
	o.terms = append(o.terms, "elected "+e.Token.String())
	o.mu.Unlock()
}
func (o *ctxObserver) Deposed(e lease.ElectionEvent) {
	o.note("deposed", e.Ctx)
	o.mu.Lock()
	o.terms = append(o.terms, "deposed "+e.Token.String()+" "+errName(e.Err))
	o.mu.Unlock()
}

func errName(err error) string {
	switch {
	case errors.Is(err, lease.ErrLost):
		return "lost"
	case errors.Is(err, lease.ErrReleased):
		return "released"
	default:
		return "other"
	}
}

// Every event carries the context it happened in: the caller's for
// Acquired and Released, the acquiring caller's for the Manager's own
// Renewed and Lost.
func TestObserverEventsCarryTheirContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &ctxObserver{}
		b := &flakyRenew{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second, lease.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		acq := context.WithValue(context.Background(), ctxKey{}, "acquire")
		rel := context.WithValue(context.Background(), ctxKey{}, "release")
		l, err := m.TryAcquire(acq, "ctx")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond) // a renewal or two
		if err := l.Release(rel); err != nil {
			t.Fatal(err)
		}
		l2, err := m.TryAcquire(acq, "ctx-lost")
		if err != nil {
			t.Fatal(err)
		}
		b.fail.Store(true)
		<-l2.Done()
		obs.mu.Lock()
		defer obs.mu.Unlock()
		want := map[string]any{"acquired": "acquire", "renewed": "acquire", "lost": "acquire", "released": "release"}
		for kind, v := range want {
			got := obs.seen[kind]
			if len(got) == 0 {
				t.Errorf("no %s event", kind)
			}
			for _, g := range got {
				if g != v {
					t.Errorf("%s event's context carries %v, want %v", kind, g, v)
				}
			}
		}
	})
}

// An ElectionObserver hears each term begin and end, in order, once each:
// the end the moment the term's lease ended (before OnDeposed), with why.
func TestElectionObserverHearsEachTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &ctxObserver{}
		b := &flakyRenew{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second, lease.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		var atDeposed []int // how many election events were reported when each OnDeposed ran
		e, err := lease.NewElection(m, "leader", lease.WithBackoff(time.Second, time.Second),
			lease.WithOnDeposed(func(l *lease.Lease, err error) {
				obs.mu.Lock()
				atDeposed = append(atDeposed, len(obs.terms))
				obs.mu.Unlock()
			}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "run"))
		terms := 0
		runDone := make(chan error, 1)
		go func() {
			runDone <- e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
				terms++
				switch terms {
				case 1:
					return nil // the term ends: released
				case 2:
					b.fail.Store(true) // renewals fail: the term ends lost
					<-ctx.Done()
					b.fail.Store(false)
					return nil
				default:
					cancel()
					<-ctx.Done()
					return nil
				}
			})
		}()
		if err := <-runDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if len(obs.terms) != 6 {
			t.Fatalf("election events %q, want 3 terms", obs.terms)
		}
		var prev fence.Token
		for i := 0; i < 6; i += 2 {
			var el, dep string
			el, dep = obs.terms[i], obs.terms[i+1]
			tok := el[len("elected "):]
			if dep[:len("deposed "+tok)] != "deposed "+tok {
				t.Fatalf("term %d: %q then %q: not the same lease", i/2, el, dep)
			}
			var n uint64
			for _, c := range tok {
				n = n*10 + uint64(c-'0')
			}
			if fence.Token(n) <= prev {
				t.Fatalf("terms' tokens do not grow: %q", obs.terms)
			}
			prev = fence.Token(n)
		}
		if got := []string{errName2(obs.terms[1]), errName2(obs.terms[3]), errName2(obs.terms[5])}; got[0] != "released" || got[1] != "lost" || got[2] != "released" {
			t.Fatalf("terms ended %q, want released, lost, released", got)
		}
		// Each OnDeposed ran after its term's Deposed was reported.
		if len(atDeposed) != 3 || atDeposed[0] != 2 || atDeposed[1] != 4 || atDeposed[2] != 6 {
			t.Fatalf("election events reported when OnDeposed ran: %v, want [2 4 6]", atDeposed)
		}
		for _, kind := range []string{"elected", "deposed"} {
			for _, v := range obs.seen[kind] {
				if v != "run" {
					t.Fatalf("%s event's context carries %v, want Run's", kind, v)
				}
			}
		}
	})
}

func errName2(ev string) string {
	i := len(ev) - 1
	for i >= 0 && ev[i] != ' ' {
		i--
	}
	return ev[i+1:]
}

// Observe reports the leader once per change, including "no one", to a
// follower that does not campaign.
func TestObserveReportsEachLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		mA, _ := lease.NewManager(b, time.Second, lease.WithIdentity("a"))
		mB, _ := lease.NewManager(b, time.Second, lease.WithIdentity("b"))
		mF, _ := lease.NewManager(b, time.Second, lease.WithIdentity("follower"))
		eF, err := lease.NewElection(mF, "leader")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var (
			mu   sync.Mutex
			seen []lease.Holder
		)
		obsDone := make(chan error, 1)
		go func() {
			obsDone <- eF.Observe(ctx, func(h lease.Holder) {
				mu.Lock()
				seen = append(seen, h)
				mu.Unlock()
			})
		}()
		synctest.Wait()
		la, err := mA.TryAcquire(ctx, "leader")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // several polls: one report
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // a poll or two sees no one
		lb, err := mB.TryAcquire(ctx, "leader")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		cancel()
		if err := <-obsDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("Observe = %v", err)
		}
		_ = lb.Release(context.Background())
		mu.Lock()
		defer mu.Unlock()
		want := []struct {
			id  string
			tok fence.Token
		}{{"", 0}, {"a", la.Token()}, {"", 0}, {"b", lb.Token()}}
		if len(seen) != len(want) {
			t.Fatalf("Observe reported %+v, want %d reports", seen, len(want))
		}
		for i, w := range want {
			if seen[i].Identity() != w.id || seen[i].Token != w.tok || (w.id == "" && seen[i].Owner != "") {
				t.Fatalf("report %d = %+v, want identity %q token %d", i, seen[i], w.id, w.tok)
			}
		}
	})
}

// A backend that cannot say who holds a lease is refused at once.
func TestObserveNeedsAnInspector(t *testing.T) {
	m, _ := lease.NewManager(struct{ lease.Backend }{memlease.New()}, time.Second)
	e, _ := lease.NewElection(m, "leader")
	err := e.Observe(context.Background(), func(lease.Holder) { t.Error("called") })
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Observe = %v, want errors.ErrUnsupported", err)
	}
	if err := e.Observe(context.Background(), nil); !errors.Is(err, lease.ErrInvalidOptions) {
		t.Fatalf("Observe(nil) = %v, want ErrInvalidOptions", err)
	}
}

// flakyRenew is a memory store whose renewals fail while fail is set (the
// store cannot be reached), so that a lease is lost at its deadline.
type flakyRenew struct {
	*memlease.Backend
	fail atomic.Bool
}

var errUnreachable = errors.New("store unreachable")

func (f *flakyRenew) Renew(ctx context.Context, g driver.Grant) error {
	if f.fail.Load() {
		return errUnreachable
	}
	return f.Backend.Renew(ctx, g)
}

func (f *flakyRenew) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	if !f.fail.Load() {
		f.Backend.RenewBatch(ctx, gs, done)
		return
	}
	for i := range gs {
		done(i, errUnreachable)
	}
}
