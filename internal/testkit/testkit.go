// Package testkit is the test equipment every module's tests share: small
// helpers that need nothing but the standard library and the core module
// (package lease). It is a package of the core module that only tests,
// benchmarks, examples and the integration suites import; library code
// never does. Being in the core module, it adds no module to any graph.
//
// Helpers that need a store's client stay with that store's harness, a
// package of the module that already uses the client
// (lease/redislease/redistest, lease/pglease/internal/pgtest,
// lease/etcdlease/etcdtest, lease/zklease/zkleasetest,
// dynamoguard/dynamotest, migrations/migrationstest), so that a backend's
// test module graph never pulls in another store's client. What only the examples and the
// integration tests use lives in internal/rig, a module never released.
// Package testenv, beside this one, tells where the services are.
package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// Timeout bounds the context of Context: long enough for a test against a
// real store on a loaded machine, short enough that a hung test fails
// with a deadline instead of the test binary's timeout.
const Timeout = time.Minute

// Context returns a context cancelled when tb ends or after Timeout,
// whichever comes first.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	tb.Cleanup(cancel)
	return ctx
}

// NewManager returns lease.NewManager(b, ttl, opts...), failing tb on an
// error.
func NewManager(tb testing.TB, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	tb.Helper()
	m, err := lease.NewManager(b, ttl, opts...)
	if err != nil {
		tb.Fatalf("lease.NewManager: %v", err)
	}
	return m
}

// Closed takes a constructor's two results: Closed(New(...))(tb) is the
// value New made, closed when tb ends, or the end of tb if New failed.
func Closed[C interface{ Close() error }](c C, err error) func(tb testing.TB) C {
	return func(tb testing.TB) C {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close() })
		return c
	}
}

// RandHex returns n random bytes in hexadecimal (2n characters), for names
// that must not collide between runs: key prefixes, schemas, tables.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

// GrantSent is the send time of the request that granted l, as m's
// options place it: l's first deadline is that plus TTL - SafetyMargin.
func GrantSent(m *lease.Manager, l *lease.Lease) time.Time {
	return l.Deadline().Add(-(l.TTL() - m.Options().SafetyMargin))
}

// RenewLog is a lease.Observer that records, for each token, the send time
// of the last request the store confirmed: a renewal, or the acquire (set
// by the test with Confirmed and GrantSent).
type RenewLog struct {
	lease.NopObserver
	mu   sync.Mutex
	sent map[fence.Token]time.Time
}

// NewRenewLog returns an empty RenewLog.
func NewRenewLog() *RenewLog { return &RenewLog{sent: map[fence.Token]time.Time{}} }

// Renewed records a confirmed renewal.
func (r *RenewLog) Renewed(e lease.RenewedEvent) {
	if e.Err == nil {
		r.Confirmed(e.Token, e.Sent)
	}
}

// Confirmed records that a request for tok sent at sent was confirmed;
// an earlier one than already recorded changes nothing.
func (r *RenewLog) Confirmed(tok fence.Token, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sent.After(r.sent[tok]) {
		r.sent[tok] = sent
	}
}

// Last returns the send time of the last confirmed request for tok (zero
// when there was none).
func (r *RenewLog) Last(tok fence.Token) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[tok]
}

// nonIdent is what UniqueName replaces in a test's name.
var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns prefix, then the end of tb's name (at most 40
// characters, lower case, each run of other characters than a-z and 0-9
// made one "_"), then "_" and 8 random hex digits: a name for a schema, a
// role or a table that no other test or run uses, and that tells which
// test made it. With a prefix of up to 14 characters it fits PostgreSQL's
// 63-byte identifiers.
func UniqueName(tb testing.TB, prefix string) string {
	tb.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(tb.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return prefix + name + "_" + RandHex(4)
}

// TryAcquire returns m.TryAcquire(Context(tb), name), failing tb on an
// error.
func TryAcquire(tb testing.TB, m *lease.Manager, name string) *lease.Lease {
	tb.Helper()
	l, err := m.TryAcquire(Context(tb), name)
	if err != nil {
		tb.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}

// RenewEvents is a lease.Observer that records every renewal's outcome
// with its send time. The zero value is ready to use.
type RenewEvents struct {
	lease.NopObserver
	mu     sync.Mutex
	events []lease.RenewedEvent
}

// Renewed records e.
func (r *RenewEvents) Renewed(e lease.RenewedEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// All returns every renewal recorded so far.
func (r *RenewEvents) All() []lease.RenewedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lease.RenewedEvent(nil), r.events...)
}

// SucceededSince reports whether a renewal of name sent after since
// succeeded.
func (r *RenewEvents) SucceededSince(name string, since time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Name == name && e.Err == nil && e.Sent.After(since) {
			return true
		}
	}
	return false
}

// LastSucceeded returns the send time of the last successful renewal
// recorded (zero when none) and how many renewals succeeded.
func (r *RenewEvents) LastSucceeded() (sent time.Time, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Err == nil {
			sent, n = e.Sent, n+1
		}
	}
	return sent, n
}

// Failures returns how many renewals failed, and the longest latency of
// any renewal.
func (r *RenewEvents) Failures() (n int, slowest time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Err != nil {
			n++
		}
		slowest = max(slowest, e.Latency)
	}
	return n, slowest
}

// Span describes the range of ds, "lo–hi" rounded to milliseconds, or "-"
// when ds is empty.
func Span(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	lo, hi := slices.Min(ds), slices.Max(ds)
	return fmt.Sprintf("%v–%v", lo.Round(time.Millisecond), hi.Round(time.Millisecond))
}

// SetupBound is how soon a blocking Acquire must give up on a store error
// that retrying cannot fix (lease.ErrSetup): "at once", generous for a
// loaded machine. AcquireFailsFast's context is six times longer.
const SetupBound = 5 * time.Second

// AcquireFailsFast runs a blocking Acquire of "jobs" with a 30 s context
// and returns its error, failing tb if it granted the lease, took longer
// than SetupBound, did not match lease.ErrSetup (or matched
// lease.ErrNotAcquired), spread over more than one line or did not contain
// fix. The caller checks that the store's own error is kept.
func AcquireFailsFast(tb testing.TB, m *lease.Manager, fix string) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*SetupBound)
	defer cancel()
	start := time.Now()
	l, err := m.Acquire(ctx, "jobs")
	took := time.Since(start)
	if err == nil {
		_ = l.Release(context.Background())
		tb.Fatalf("Acquire granted the lease; want a setup error")
	}
	tb.Logf("Acquire returned after %v: %v", took.Round(time.Millisecond), err)
	if took > SetupBound {
		tb.Fatalf("Acquire returned after %v (want within %v): %v", took, SetupBound, err)
	}
	if !errors.Is(err, lease.ErrSetup) || errors.Is(err, lease.ErrNotAcquired) {
		tb.Fatalf("Acquire = %v; want an error matching lease.ErrSetup, not ErrNotAcquired", err)
	}
	if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), fix) {
		tb.Fatalf("Acquire = %q; want one line naming the fix %q", err, fix)
	}
	return err
}

// CheckIsSetup runs m.Check and returns its error, failing tb unless it is
// one line matching lease.ErrSetup that contains fix.
func CheckIsSetup(tb testing.TB, m *lease.Manager, fix string) error {
	tb.Helper()
	err := m.Check(Context(tb))
	if !errors.Is(err, lease.ErrSetup) || !strings.Contains(err.Error(), fix) || strings.Contains(err.Error(), "\n") {
		tb.Fatalf("Check = %v; want one line matching lease.ErrSetup naming %q", err, fix)
	}
	return err
}

// Acquired is the outcome of an Acquire that AcquireAsync started: the
// lease, when Acquire returned, and its error.
type Acquired struct {
	Lease *lease.Lease
	At    time.Time
	Err   error
}

// AcquireAsync runs m.Acquire(ctx, name) on a goroutine of its own and
// sends its outcome, with the time it returned, on the channel it returns
// (buffered: the goroutine never blocks on it).
func AcquireAsync(ctx context.Context, m *lease.Manager, name string) <-chan Acquired {
	ch := make(chan Acquired, 1)
	go func() {
		l, err := m.Acquire(ctx, name)
		ch <- Acquired{l, time.Now(), err}
	}()
	return ch
}

// ExpectTakeover waits up to timeout for the Acquire that ch reports
// (AcquireAsync) and checks that it took over from prev: it succeeded
// after prev's local deadline, and with a greater token. The deadline is
// compared, not the moment prev's Done was seen (up to a late timer's
// slack after it): a correct grant may come in between. At is read after
// the grant, so an At at or before the deadline proves a grant before it.
// who names the acquirer in failures. It returns the outcome.
func ExpectTakeover(tb testing.TB, who string, prev *lease.Lease, ch <-chan Acquired, timeout time.Duration) Acquired {
	tb.Helper()
	var g Acquired
	select {
	case g = <-ch:
	case <-time.After(timeout):
		tb.Fatalf("%s did not acquire within %v", who, timeout)
	}
	if g.Err != nil {
		tb.Fatalf("%s: Acquire: %v", who, g.Err)
	}
	if dl := prev.Deadline(); !g.At.After(dl) {
		tb.Fatalf("%s acquired %v before the holder's local deadline", who, dl.Sub(g.At))
	}
	if g.Lease.Token() <= prev.Token() {
		tb.Fatalf("%s: token %d after %d", who, g.Lease.Token(), prev.Token())
	}
	return g
}

// RenewFindsTakenOver renews l, whose name the store now grants to
// another owner, and checks that the lease ends at once: Renew returns a
// *lease.LostError for lease.LostTakenOver, l's Done is closed by the time
// it returns, and a Release after it returns an error matching
// lease.ErrLost. ctx bounds both calls. What the Release left at the
// store (the other owner's grant untouched) is the caller's to check.
func RenewFindsTakenOver(tb testing.TB, ctx context.Context, l *lease.Lease) {
	tb.Helper()
	err := l.Renew(ctx)
	var le *lease.LostError
	if !errors.As(err, &le) || le.Reason != lease.LostTakenOver {
		tb.Fatalf("Renew = %v, want a LostError (taken over)", err)
	}
	select {
	case <-l.Done():
	default:
		tb.Fatal("Done not closed when Renew returned")
	}
	if err := l.Release(ctx); !errors.Is(err, lease.ErrLost) {
		tb.Fatalf("Release = %v, want ErrLost", err)
	}
}
