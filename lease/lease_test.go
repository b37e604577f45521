package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// faultBackend wraps a Backend to count calls and inject faults.
type faultBackend struct {
	lease.Backend
	calls        atomic.Int64
	acquireDelay time.Duration
	storeTTL     time.Duration             // if set, the TTL the store keeps grants for, whatever it reports
	entered      atomic.Pointer[time.Time] // when the last Acquire reached the backend
	renewErr     atomic.Pointer[error]
	renews       atomic.Int64
	// sentShift, if set, makes a grant's Sent the time its Acquire reached
	// the backend shifted by it (earlier when negative).
	sentShift time.Duration
}

func (f *faultBackend) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	now := time.Now()
	f.entered.Store(&now)
	f.calls.Add(1)
	asked := r.TTL
	if f.storeTTL > 0 {
		r.TTL = f.storeTTL
	}
	g, err := f.Backend.Acquire(ctx, r)
	if err == nil && f.storeTTL > 0 {
		g.TTL = asked
	}
	if err == nil && f.sentShift != 0 {
		g.Sent = now.Add(f.sentShift)
	}
	time.Sleep(f.acquireDelay) // the reply is held up on its way back
	return g, err
}

func (f *faultBackend) Renew(ctx context.Context, r driver.Grant) error {
	f.calls.Add(1)
	f.renews.Add(1)
	if p := f.renewErr.Load(); p != nil {
		return *p
	}
	return f.Backend.Renew(ctx, r)
}

func (f *faultBackend) Release(ctx context.Context, r driver.Grant) error {
	f.calls.Add(1)
	return f.Backend.Release(ctx, r)
}

func TestNewManagerRejectsBadOptions(t *testing.T) {
	valid := lease.Options{TTL: time.Second}
	for _, tc := range []struct {
		name    string
		nilB    bool
		opts    lease.Options
		wantSub []string
	}{
		{"nil backend", true, valid, []string{"backend is nil"}},
		{"zero TTL", false, lease.Options{}, []string{"TTL is 0s"}},
		{"negative TTL", false, lease.Options{TTL: -time.Second}, []string{"TTL is -1s"}},
		{"TTL not whole ms", false, lease.Options{TTL: 1500 * time.Microsecond}, []string{"whole multiple of 1ms"}},
		{"TTL too short", false, lease.Options{TTL: 5 * time.Millisecond}, []string{"TTL 5ms is too short", "renew every (TTL - safety margin)/3"}},
		{"margin >= TTL", false, lease.Options{TTL: time.Second, SafetyMargin: time.Second}, []string{"safety margin 1s must be less than the TTL"}},
		{"negative margin", false, lease.Options{TTL: time.Second, SafetyMargin: -2 * time.Millisecond}, []string{"must not be negative"}},
		{"renew interval == TTL", false, lease.Options{TTL: time.Second, RenewInterval: time.Second}, []string{"cannot keep the lease alive"}},
		{"renew interval just above half", false, lease.Options{TTL: time.Second, RenewInterval: 495 * time.Millisecond}, []string{"cannot keep the lease alive"}},
		{"negative renew interval", false, lease.Options{TTL: time.Second, RenewInterval: -time.Millisecond}, []string{"renew interval is -1ms"}},
		{"negative poll", false, lease.Options{TTL: time.Second, PollInterval: -1}, []string{"poll interval"}},
		{"negative release timeout", false, lease.Options{TTL: time.Second, ReleaseTimeout: -1}, []string{"release timeout"}},
		{"identity with space", false, lease.Options{TTL: time.Second, Identity: "a b"}, []string{"identity"}},
		{"identity too long", false, lease.Options{TTL: time.Second, Identity: strings.Repeat("x", 129)}, []string{"identity is 129 bytes"}},
		{"all at once", true, lease.Options{TTL: time.Second, SafetyMargin: 2 * time.Second, RenewInterval: -1, PollInterval: -1}, []string{"backend is nil", "safety margin", "renew interval", "poll interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := &faultBackend{Backend: memlease.New()}
			var b lease.Backend = fb
			if tc.nilB {
				b = nil
			}
			m, err := lease.NewManager(b, tc.opts.TTL, withOptions(tc.opts))
			if err == nil || m != nil {
				t.Fatalf("NewManager = %v, %v; want an error", m, err)
			}
			if !errors.Is(err, lease.ErrInvalidOptions) {
				t.Fatalf("error %v does not match ErrInvalidOptions", err)
			}
			for _, s := range tc.wantSub {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if n := fb.calls.Load(); n != 0 {
				t.Fatalf("%d backend calls during construction, want 0", n)
			}
		})
	}
}

// withOptions is an Option that sets every field from o (tests build
// option tables as structs).
func withOptions(o lease.Options) lease.Option { return func(p *lease.Options) { *p = o } }

func TestNewManagerDoesNotChangeCallerOptions(t *testing.T) {
	opts := lease.Options{TTL: 3 * time.Second}
	m, err := lease.NewManager(memlease.New(), opts.TTL, withOptions(opts), lease.WithRenewInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if opts != (lease.Options{TTL: 3 * time.Second}) {
		t.Fatalf("caller's options changed: %+v", opts)
	}
	got := m.Options()
	if got.RenewInterval != time.Second || got.SafetyMargin != 3*time.Second/100+2*time.Millisecond || got.Identity == "" {
		t.Fatalf("effective options %+v", got)
	}
	d, _ := lease.NewManager(memlease.New(), 9*time.Second)
	if o := d.Options(); o.RenewInterval != (9*time.Second-o.SafetyMargin)/3 {
		t.Fatalf("default renew interval = %v, want (TTL - margin)/3", o.RenewInterval)
	}
	for _, ttl := range []time.Duration{10 * time.Millisecond, 11 * time.Millisecond, 100 * time.Millisecond, time.Hour} {
		if _, err := lease.NewManager(memlease.New(), ttl); err != nil {
			t.Errorf("the defaults for TTL %v are invalid: %v", ttl, err)
		}
	}
}

func TestBadNamesDoNoIO(t *testing.T) {
	fb := &faultBackend{Backend: memlease.New()}
	m, err := lease.NewManager(fb, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"", strings.Repeat("n", driver.MaxNameLen+1), "bad\x00nul", "new\nline", "\xff\xfe"} {
		if _, err := m.TryAcquire(context.Background(), n); !errors.Is(err, lease.ErrInvalidName) {
			t.Errorf("TryAcquire(%q) = %v, want ErrInvalidName", n, err)
		}
		if _, err := m.Acquire(context.Background(), n); !errors.Is(err, lease.ErrInvalidName) {
			t.Errorf("Acquire(%q) = %v, want ErrInvalidName", n, err)
		}
	}
	if n := fb.calls.Load(); n != 0 {
		t.Fatalf("%d backend calls for invalid names, want 0", n)
	}
	if err := lease.ValidateName(strings.Repeat("n", driver.MaxNameLen)); err != nil {
		t.Fatalf("a name of MaxNameLen bytes was rejected: %v", err)
	}
}

// The local deadline counts from when the request was sent, not from when
// the reply arrived.
func TestDeadlineCountsFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &faultBackend{Backend: memlease.New(), acquireDelay: 150 * time.Millisecond}
		m, err := lease.NewManager(fb, time.Second, lease.WithoutAutoRenew())
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		l, err := m.TryAcquire(context.Background(), "deadline")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		after := time.Now()
		// The request was sent between before and when it reached the backend;
		// the reply came 150 ms after that. No timing is assumed.
		entered := *fb.entered.Load()
		want := time.Second - m.Options().SafetyMargin
		if dl := l.Deadline(); dl.Before(before.Add(want)) || dl.After(entered.Add(want)) {
			t.Fatalf("deadline is %v after the call began, %v after the request reached the store and %v after the call returned; want %v after the send",
				dl.Sub(before), dl.Sub(entered), dl.Sub(after), want)
		}
	})
}

// A grant the store proved from an earlier request (driver.Grant.Sent)
// counts its local deadline and its first renewal from that request's send
// time; a Sent later than the Acquire call moves nothing.
func TestDeadlineCountsFromGrantSent(t *testing.T) {
	const ttl, every = time.Second, 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		shift time.Duration
		from  func(call, entered time.Time) time.Time
	}{
		{"earlier", -150 * time.Millisecond, func(_, entered time.Time) time.Time { return entered.Add(-150 * time.Millisecond) }},
		{"later", 50 * time.Millisecond, func(call, _ time.Time) time.Time { return call }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fb := &faultBackend{Backend: memlease.New(), sentShift: tc.shift, acquireDelay: 100 * time.Millisecond}
				m, err := lease.NewManager(fb, ttl, lease.WithRenewInterval(every))
				if err != nil {
					t.Fatal(err)
				}
				call := time.Now()
				l, err := m.TryAcquire(context.Background(), "sent")
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
				from := tc.from(call, *fb.entered.Load())
				if want := from.Add(ttl - m.Options().SafetyMargin); !l.Deadline().Equal(want) {
					t.Fatalf("deadline %v after the call, want %v", l.Deadline().Sub(call), want.Sub(call))
				}
				// The first renewal is due RenewInterval after the same instant.
				time.Sleep(time.Until(from.Add(every)) - time.Millisecond)
				synctest.Wait()
				if n := fb.renews.Load(); n != 0 {
					t.Fatalf("renewed %d times before %v after the call", n, from.Add(every).Sub(call))
				}
				time.Sleep(2 * time.Millisecond)
				synctest.Wait()
				if n := fb.renews.Load(); n != 1 {
					t.Fatalf("%d renewals by %v after the call, want 1", n, time.Since(call))
				}
			})
		})
	}
}

// A grant whose reply arrives after its local deadline is given back and
// reported as not acquired.
func TestLateGrantIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memlease.New()
		// The store keeps the grant for a minute, so that only a give-back
		// frees it for the next owner.
		fb := &faultBackend{Backend: mem, acquireDelay: 120 * time.Millisecond, storeTTL: time.Minute}
		m, err := lease.NewManager(fb, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "late")
		if !errors.Is(err, lease.ErrNotAcquired) || l != nil {
			t.Fatalf("TryAcquire with a late reply = %v, %v; want ErrNotAcquired", l, err)
		}
		// The grant was given back: another owner gets it at once.
		m2, _ := lease.NewManager(mem, time.Second)
		l2, err := m2.TryAcquire(context.Background(), "late")
		if err != nil {
			t.Fatalf("the late grant was not given back: %v", err)
		}
		l2.Release(context.Background())
	})
}

func TestHeartbeatKeepsLeaseAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &faultBackend{Backend: memlease.New()}
		// TTL 600 ms, renewed every 196 ms: a renewal may run up to 400 ms late
		// (a loaded machine) before the lease ends; two seconds need ten.
		m, err := lease.NewManager(fb, 600*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "hb")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if err := l.Err(); err != nil {
			t.Fatalf("lease ended while renewed: %v", err)
		}
		if n := fb.renews.Load(); n < 3 {
			t.Fatalf("%d renewals in 2s with TTL 600ms, want several", n)
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Transient renew errors are retried; at the local deadline the lease is lost
// with the last error as its cause, even though the store never answered.
func TestTransientRenewErrorsLoseAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &faultBackend{Backend: memlease.New()}
		ttl := 300 * time.Millisecond
		m, err := lease.NewManager(fb, ttl)
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "transient")
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("connection refused")
		fb.renewErr.Store(&boom)
		deadline := l.Deadline()
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lease not lost after renewals kept failing")
		}
		lostAt := time.Now()
		if lostAt.Before(deadline) {
			t.Fatalf("lost %v before the deadline", deadline.Sub(lostAt))
		}
		var le *lease.LostError
		if !errors.As(l.Err(), &le) || le.Reason != lease.LostExpired || !errors.Is(l.Err(), boom) {
			t.Fatalf("Err = %v, want an expired LostError caused by %v", l.Err(), boom)
		}
		if n := fb.renews.Load(); n < 3 {
			t.Fatalf("%d renew attempts, want retries", n)
		}
		if err := l.Release(context.Background()); !errors.Is(err, lease.ErrLost) {
			t.Fatalf("Release = %v, want ErrLost", err)
		}
	})
}

// A renew that finds another owner ends the lease at once.
func TestRenewTakenOverCancelsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &faultBackend{Backend: memlease.New()}
		m, err := lease.NewManager(fb, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "takeover")
		if err != nil {
			t.Fatal(err)
		}
		notHeld := lease.ErrNotHeld
		fb.renewErr.Store(&notHeld)
		testkit.RenewFindsTakenOver(t, context.Background(), l)
	})
}

func TestAcquireGivesUpWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memlease.New()
		m, _ := lease.NewManager(mem, 10*time.Second)
		l, err := m.TryAcquire(context.Background(), "busy")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = m.Acquire(ctx, "busy")
		if !errors.Is(err, lease.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, want ErrNotAcquired joined with DeadlineExceeded", err)
		}
	})
}

// stuckBackend grants the first acquire at the store, then holds its reply
// until the request's context ends (as etcd holds a proposal lost with its
// leader until its request timeout); later acquires are answered at once.
type stuckBackend struct {
	*memlease.Backend
	calls     atomic.Int32
	firstDone chan struct{}
	first     struct {
		entered, deadline time.Time
		hasDeadline       bool
		token             fence.Token
		owner             string
	}
	mu      sync.Mutex
	abandon []string
}

func (s *stuckBackend) Abandon(ctx context.Context, r driver.Request) error {
	s.mu.Lock()
	s.abandon = append(s.abandon, r.Owner)
	s.mu.Unlock()
	return s.Backend.Abandon(ctx, r)
}

func (s *stuckBackend) abandoned() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.abandon...)
}

func (s *stuckBackend) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	if s.calls.Add(1) > 1 {
		return s.Backend.Acquire(ctx, r)
	}
	defer close(s.firstDone)
	s.first.entered = time.Now()
	s.first.deadline, s.first.hasDeadline = ctx.Deadline()
	g, err := s.Backend.Acquire(ctx, r)
	if err != nil {
		return g, err
	}
	s.first.token, s.first.owner = g.Token, g.Owner
	<-ctx.Done()
	return driver.Grant{}, ctx.Err()
}

// A blocking Acquire bounds each attempt by the lease's validity: an
// attempt the store holds longer is abandoned (its grant could not be used
// anyway). The store is told to end the abandoned owner (Backend.Abandon),
// which frees the grant the stuck request made and refuses that owner from
// then on, and the retry goes out under a new owner. Without the bound,
// Acquire waits for the caller's context and fails; without the Abandon,
// the stuck request's grant (or a late copy of it) holds the name for an
// owner nobody holds.
func TestAcquireAbandonsAnAttemptHeldPastValidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &stuckBackend{Backend: memlease.New(), firstDone: make(chan struct{})}
		const ttl = 2 * time.Second
		m, err := lease.NewManager(sb, ttl, lease.WithPollInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := m.Acquire(ctx, "stuck")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		defer l.Release(context.Background())
		<-sb.firstDone
		validity := ttl - m.Options().SafetyMargin
		if !sb.first.hasDeadline || sb.first.deadline.After(sb.first.entered.Add(validity)) {
			t.Fatalf("the first attempt's context: deadline %v (set: %v), %v after the request reached the store; want at most the validity %v",
				sb.first.deadline, sb.first.hasDeadline, sb.first.deadline.Sub(sb.first.entered), validity)
		}
		if l.Owner() == sb.first.owner {
			t.Fatalf("the lease has the abandoned attempt's owner %q; want a new one", l.Owner())
		}
		if l.Token() <= sb.first.token {
			t.Fatalf("lease token %d; want more than %d, the abandoned grant's", l.Token(), sb.first.token)
		}
		if got := sb.abandoned(); len(got) != 1 || got[0] != sb.first.owner {
			t.Fatalf("abandoned owners %q; want just the first attempt's %q", got, sb.first.owner)
		}
		// The abandoned request, arriving again late, grants nothing.
		late := driver.Request{Name: "stuck", Owner: sb.first.owner, TTL: ttl}
		if _, err := sb.Backend.Acquire(ctx, late); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("a late copy of the abandoned request = %v, want ErrNotAcquired", err)
		}
	})
}

// TryAcquire's single attempt is bounded by its context alone (here longer
// than the validity, 988 ms), as documented. The store had granted it:
// TryAcquire abandons the owner before returning, so the name is free at
// once instead of after a TTL.
func TestTryAcquireIsBoundedByItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &stuckBackend{Backend: memlease.New(), firstDone: make(chan struct{})}
		m, err := lease.NewManager(sb, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		if _, err := m.TryAcquire(ctx, "stuck"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire = %v, want the context's DeadlineExceeded", err)
		}
		<-sb.firstDone
		if dl, _ := ctx.Deadline(); !sb.first.deadline.Equal(dl) {
			t.Fatalf("the attempt's deadline %v, want the caller's %v", sb.first.deadline, dl)
		}
		if got := sb.abandoned(); len(got) != 1 || got[0] != sb.first.owner {
			t.Fatalf("abandoned owners %q; want the unanswered attempt's %q", got, sb.first.owner)
		}
		h, err := sb.Holder(context.Background(), "stuck")
		if !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("after TryAcquire gave up, the store names %+v (%v); want no holder", h, err)
		}
	})
}

func TestLeaseContextCarriesTokenAndValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := lease.NewManager(memlease.New(), time.Second)
		type key struct{}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		l, err := m.TryAcquire(ctx, "ctx")
		if err != nil {
			t.Fatal(err)
		}
		cancel() // ends the acquire's context, not the lease
		if l.Context().Err() != nil {
			t.Fatal("cancelling the acquire context ended the lease")
		}
		if tok, ok := fence.FromContext(l.Context()); !ok || tok != l.Token() {
			t.Fatalf("FromContext = %d, %v; want %d", tok, ok, l.Token())
		}
		if l.Context().Value(key{}) != "v" {
			t.Fatal("lease context lost the acquire context's values")
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

type recordingObserver struct {
	lease.NopObserver
	mu                                sync.Mutex
	acquired, renewed, lost, released int
}

func (r *recordingObserver) Acquired(lease.AcquiredEvent) { r.mu.Lock(); r.acquired++; r.mu.Unlock() }
func (r *recordingObserver) Renewed(lease.RenewedEvent)   { r.mu.Lock(); r.renewed++; r.mu.Unlock() }
func (r *recordingObserver) Lost(lease.LostEvent)         { r.mu.Lock(); r.lost++; r.mu.Unlock() }
func (r *recordingObserver) Released(lease.ReleasedEvent) { r.mu.Lock(); r.released++; r.mu.Unlock() }

func TestObserverEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &recordingObserver{}
		m, _ := lease.NewManager(memlease.New(), time.Second, lease.WithoutAutoRenew(), lease.WithObserver(obs))
		l, _ := m.TryAcquire(context.Background(), "obs")
		_ = l.Renew(context.Background())
		_ = l.Release(context.Background())
		l2, _ := m.TryAcquire(context.Background(), "obs2")
		<-l2.Done()
		_ = l2.Release(context.Background())
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if obs.acquired != 2 || obs.renewed != 1 || obs.released != 1 || obs.lost != 1 {
			t.Fatalf("events: %+v", obs)
		}
	})
}

// The heartbeat counts from the send time of the acquire: a slow reply does
// not delay the first renewal towards the deadline.
func TestFirstRenewalCountsFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := &faultBackend{Backend: memlease.New(), acquireDelay: 800 * time.Millisecond}
		m, err := lease.NewManager(fb, 3*time.Second) // renew every 1s
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "slow-reply")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		returned := time.Now()
		for fb.renews.Load() == 0 {
			if time.Since(returned) > 2*time.Second {
				t.Fatal("no renewal within 2s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Sent 800 ms before the reply, so due about 200 ms after it.
		if d := time.Since(returned); d > 600*time.Millisecond {
			t.Fatalf("first renewal %v after the reply; it is due 1s after the send, about 200ms after the reply", d)
		}
	})
}

// acquireCounter counts the acquire requests sent to a backend.
type acquireCounter struct {
	*memlease.Backend
	n atomic.Int64
}

func (b *acquireCounter) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.n.Add(1)
	return b.Backend.Acquire(ctx, req)
}

// TestRunRefusesNilFuncBeforeAcquiring: a nil function is bad input, refused
// before any request; Run must not first wait for a lease another holder
// has (or take one it will never use).
func TestRunRefusesNilFuncBeforeAcquiring(t *testing.T) {
	b := &acquireCounter{Backend: memlease.New()}
	m, err := lease.NewManager(b, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, run := range []func(context.Context, string, func(context.Context, *lease.Lease) error) error{m.Run, m.TryRun} {
		if err := run(ctx, "job", nil); !errors.Is(err, lease.ErrInvalidOptions) {
			t.Fatalf("Run with a nil function: %v; want ErrInvalidOptions", err)
		}
	}
	if n := b.n.Load(); n != 0 {
		t.Fatalf("%d acquire requests sent for a nil function", n)
	}
}

// A TTL too short for the intervals it implies is reported once, as a
// problem of the TTL, naming the shortest TTL that works; a field the
// caller set is still reported under its own name.
func TestShortTTLIsOneProblem(t *testing.T) {
	for _, tc := range []struct {
		ttl      time.Duration
		opts     []lease.Option
		want     string
		mustNot  []string
		shortest time.Duration
	}{
		{ttl: time.Millisecond, want: "TTL 1ms is too short: the default intervals", mustNot: []string{"renew interval is", "poll interval is", "\n"}, shortest: 6 * time.Millisecond},
		{ttl: 3 * time.Millisecond, want: "TTL 3ms is too short: the default intervals", mustNot: []string{"\n"}, shortest: 6 * time.Millisecond},
		{ttl: time.Millisecond, opts: []lease.Option{lease.WithRenewInterval(500 * time.Microsecond)}, want: "renew interval is 500µs", mustNot: []string{}},
	} {
		_, err := lease.NewManager(memlease.New(), tc.ttl, tc.opts...)
		if !errors.Is(err, lease.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("TTL %v: %v; want ErrInvalidOptions saying %q", tc.ttl, err, tc.want)
		}
		for _, bad := range tc.mustNot {
			if strings.Contains(err.Error(), bad) {
				t.Fatalf("TTL %v: %q says %q", tc.ttl, err, bad)
			}
		}
		if tc.shortest > 0 {
			if !strings.Contains(err.Error(), "at least "+tc.shortest.String()) {
				t.Fatalf("TTL %v: %q does not name the shortest TTL %v", tc.ttl, err, tc.shortest)
			}
			if _, err := lease.NewManager(memlease.New(), tc.shortest); err != nil {
				t.Fatalf("the TTL the error names, %v, is refused too: %v", tc.shortest, err)
			}
			if _, err := lease.NewManager(memlease.New(), tc.shortest-time.Millisecond); err == nil {
				t.Fatalf("%v is not the shortest: %v works", tc.shortest, tc.shortest-time.Millisecond)
			}
		}
	}
}
