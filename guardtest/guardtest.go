// Package guardtest is the conformance suite every guard must pass: the
// contract of a fenced write (docs/design.md, invariants 5 to 7, and
// docs/writing-a-guard.md). A guard's own tests implement a small adapter,
// Resource, over the guard's API and call Run against the real store:
//
//	func TestConformance(t *testing.T) {
//		guardtest.Run(t, guardtest.Config{
//			NewResource: func(t *testing.T) guardtest.Resource { return newRow(t) },
//			NewMissing:  func(t *testing.T) guardtest.Resource { return missingRow(t) },
//			IsMissing:   func(err error) bool { return errors.Is(err, mystore.ErrNotFound) },
//			Lacks: map[guardtest.Capability]string{
//				guardtest.LoseReply: "no way to drop a reply yet",
//			},
//		})
//	}
//
// The checks, each a parallel subtest of Run:
//
//   - StaleTokenIsRejected: a token older than the newest accepted one is
//     refused with an error matching fence.ErrStaleToken whose
//     *fence.StaleError names the presented and the current token, and
//     the resource's value and token are unchanged.
//   - EqualTokenIsAccepted: the holder of the newest token writes again.
//   - GreaterTokenIsAccepted: a newer token is accepted and becomes the
//     newest; the first write to a fresh resource is accepted.
//   - MissingTargetIsNotStale: a write to a target that does not exist
//     fails with an error the adapter classifies as missing, never one
//     matching fence.ErrStaleToken (capability Missing).
//   - ZeroTokenIsRefused: fence.None is refused with an error matching
//     fence.ErrInvalidToken, nothing changed; ZeroTokenIsRefusedBeforeIO:
//     and nothing was sent to the store (capability CountIO).
//   - LostReplyIsReportedAsUnknown: a write the store applied whose reply
//     was lost is reported with an error matching fence.ErrOutcomeUnknown,
//     or as success if the guard learned from the store that it landed;
//     never as a plain failure or a rejection; a later read shows it
//     applied or not, the same way twice (capability LoseReply).
//   - ConcurrentWritersAreLinearizable: several goroutines write random
//     tokens to one resource; the history of calls, answers and the final
//     read must pass CheckHistory.
//   - ObserverSeesEachWrite: a guard given a fence.WriteObserver reports
//     one event per write, after it returned, with the guard's name, the
//     resource's class and the write's op (so that leaseprom and leaseotel
//     label every guard's writes alike), the token presented, the error
//     the caller got, its outcome (accepted, stale, failed) and the
//     caller's context (capability Observer).
//   - SetupErrorsNameTheFix: the guard's start-up check passes on a store
//     set up for it; on one that is not (a table without lock_version, a
//     missing bucket), the check and a write both fail with an error
//     matching fence.ErrSetup, which is lease.ErrSetup, and carrying a
//     *fence.SetupError that names the fix (capability Setup).
//
// Every check writes values containing quotes, a semicolon, a backslash
// and non-ASCII text, and reads them back byte for byte: values travel as
// data (bind parameters, request bodies), never as query text.
//
// # Capabilities
//
// A check that needs something not every guard has is skipped by name
// (t.Skip, so "go test -v" lists it as SKIP, never as PASS) when the guard
// declares the capability missing in Config.Lacks with the reason. A
// capability that is neither provided nor declared missing fails the
// check: nothing is skipped silently.
package guardtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Resource is one fenced target of a guard (a row, an object, a resource
// name) as the suite sees it. The guard's test implements it over the
// guard's own API. Its methods may be called from several goroutines at
// once; an adapter that has connections should spread the calls over
// several of them (a pool), as independent holders would.
type Resource interface {
	// Write writes value with token through the guard, as a holder of a
	// lease would, and returns the guard's error (wrapping it is fine).
	Write(ctx context.Context, token fence.Token, value string) error
	// Read returns the value the resource holds and the newest token the
	// guard accepted for it, read from the store (not from a cache of the
	// adapter). A resource that no write was accepted for yet reads as
	// ("", fence.None) or as the value it was created with and
	// fence.None.
	Read(ctx context.Context) (value string, token fence.Token, err error)
}

// Capability names something a guard (or its adapter) may be unable to do.
type Capability string

const (
	// Missing: the guard has a notion of a missing target (a row that
	// does not exist, for an update) and Config.NewMissing and
	// Config.IsMissing are set.
	Missing Capability = "missing-target"
	// LoseReply: Config.LoseReply is set, so the suite can check how the
	// guard reports a write whose reply was lost after the store applied
	// it (docs/design.md, invariant 6).
	LoseReply Capability = "lose-reply"
	// CountIO: Config.CountIO is set, so the suite can check that bad
	// input is refused before anything is sent (docs/design.md, invariant 7).
	CountIO Capability = "count-io"
	// Observer: Config.Observe is set, so the suite can check the events
	// a guard reports to its fence.WriteObserver.
	Observer Capability = "observer"
	// Setup: Config.Check and Config.NewBroken are set, so the suite can
	// check the guard's start-up check and its setup errors.
	Setup Capability = "setup"
)

// Config describes the guard under test.
type Config struct {
	// NewResource prepares a fresh resource for one check, isolated from
	// every other (registering its cleanup with t): one that exists where
	// the guard has a notion of existence, with no token accepted yet.
	// Called from the check's goroutine. Required.
	NewResource func(t *testing.T) Resource

	// NewMissing returns a target that does not exist, which a write
	// cannot create (an Update of a row that is not there). Nil unless
	// Lacks names Missing.
	NewMissing func(t *testing.T) Resource
	// IsMissing reports whether err is the guard's "target not found"
	// error. Required with NewMissing.
	IsMissing func(err error) bool

	// LoseReply arms r so that its next Write reaches the store, the
	// store applies it, and the reply is lost: the guard hears nothing
	// more from the store until that Write returns (the connection
	// breaks, every further request of the call fails). After the Write
	// returns the store works normally again and has finished with the
	// write. Nil unless Lacks names LoseReply.
	LoseReply func(t *testing.T, r Resource)

	// CountIO returns how many requests r's guard has sent to the store
	// so far (messages, HTTP requests: anything that leaves the process).
	// Nil unless Lacks names CountIO.
	CountIO func(r Resource) int64

	// Observe makes r's guard report every write of r to o from now on
	// (the guard made again with its observer option, a Table's
	// WithObserver), and returns what each write's event must say besides
	// its token and outcome: Guard, Class, Op, and Resource ("" leaves it
	// unchecked). Nil unless Lacks names Observer.
	Observe func(t *testing.T, r Resource, o fence.WriteObserver) Want

	// Check runs the guard's start-up check (Guard.Check, Table.Check)
	// for r's store. NewBroken returns a resource whose store is not set
	// up for the guard in a way the check finds: a table without
	// lock_version, a schema not migrated, a bucket or table that does not
	// exist. Both nil unless Lacks names Setup.
	Check     func(ctx context.Context, r Resource) error
	NewBroken func(t *testing.T) Resource

	// Writers and WritesPerWriter size ConcurrentWritersAreLinearizable.
	// Defaults 4 and 25.
	Writers, WritesPerWriter int

	// Timeout bounds each check's calls to the store. Default 2 minutes
	// (a loaded machine, not a slow guard).
	Timeout time.Duration

	// Lacks maps each capability the guard does not have to the reason.
	Lacks map[Capability]string
}

// Run runs the whole suite as parallel subtests of t.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.NewResource == nil {
		t.Fatal("guardtest: Config.NewResource is nil")
	}
	if cfg.NewMissing != nil && cfg.IsMissing == nil {
		t.Fatal("guardtest: Config.NewMissing is set without Config.IsMissing")
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 4
	}
	if cfg.WritesPerWriter <= 0 {
		cfg.WritesPerWriter = 25
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	tests := []struct {
		name string
		fn   func(*testing.T, Config)
	}{
		{"StaleTokenIsRejected", testStale},
		{"EqualTokenIsAccepted", testEqual},
		{"GreaterTokenIsAccepted", testGreater},
		{"MissingTargetIsNotStale", testMissing},
		{"ZeroTokenIsRefused", testZero},
		{"ZeroTokenIsRefusedBeforeIO", testZeroBeforeIO},
		{"LostReplyIsReportedAsUnknown", testLostReply},
		{"ConcurrentWritersAreLinearizable", testConcurrent},
		{"ObserverSeesEachWrite", testObserver},
		{"SetupErrorsNameTheFix", testSetup},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, cfg)
		})
	}
}

// need skips t, by name, when the guard declares c missing, and fails it
// when c is neither provided nor declared missing.
func need(t *testing.T, cfg Config, c Capability, has bool) {
	t.Helper()
	reason, lacks := cfg.Lacks[c]
	switch {
	case has && lacks:
		t.Fatalf("capability %q is both provided and declared missing (%s)", c, reason)
	case has:
	case lacks:
		t.Skipf("capability %q not tested: the guard lacks it: %s", c, reason)
	default:
		t.Fatalf("capability %q is neither provided in Config nor declared missing in Config.Lacks", c)
	}
}

func ctxT(t *testing.T, cfg Config) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), cfg.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// value returns a value unique to this check and tag that also contains
// the characters that break SQL text, paths and encodings.
func value(tag string) string {
	return fmt.Sprintf(`%s %08x it's "x"; DROP TABLE t; -- \ é ✓`, tag, rand.Uint32())
}

type state struct {
	value string
	token fence.Token
}

func read(t *testing.T, ctx context.Context, r Resource) state {
	t.Helper()
	v, tok, err := r.Read(ctx)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return state{v, tok}
}

// mustWrite writes and fails t unless the write was accepted and reads
// back exactly.
func mustWrite(t *testing.T, ctx context.Context, r Resource, tok fence.Token, tag string) state {
	t.Helper()
	v := value(tag)
	if err := r.Write(ctx, tok, v); err != nil {
		t.Fatalf("Write(token %d) = %v; want it accepted", tok, err)
	}
	want := state{v, tok}
	if got := read(t, ctx, r); got != want {
		t.Fatalf("after an accepted write with token %d: read %q with token %d; want %q with token %d", tok, got.value, got.token, want.value, want.token)
	}
	return want
}

func testStale(t *testing.T, cfg Config) {
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	before := mustWrite(t, ctx, r, 100, "newest")
	for _, tok := range []fence.Token{99, 1} {
		err := r.Write(ctx, tok, value("stale"))
		if !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("Write(token %d) after token 100 was accepted = %v; want an error matching fence.ErrStaleToken", tok, err)
		}
		if errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("Write(token %d) = %v: a rejection must not also say that its outcome is unknown", tok, err)
		}
		var se *fence.StaleError
		if !errors.As(err, &se) {
			t.Fatalf("Write(token %d) = %v: no *fence.StaleError in the chain", tok, err)
		}
		if se.Presented != tok || se.Current != 100 {
			t.Errorf("StaleError names presented %d, current %d; want presented %d, current 100", se.Presented, se.Current, tok)
		}
		if !strings.Contains(err.Error(), tok.String()) || !strings.Contains(err.Error(), "100") {
			t.Errorf("error %q does not say both tokens", err)
		}
		if got := read(t, ctx, r); got != before {
			t.Fatalf("a rejected write changed the resource: read %q with token %d; want %q with token %d", got.value, got.token, before.value, before.token)
		}
	}
}

func testEqual(t *testing.T, cfg Config) {
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	mustWrite(t, ctx, r, 7, "first")
	mustWrite(t, ctx, r, 7, "again")
	mustWrite(t, ctx, r, 7, "and again")
}

func testGreater(t *testing.T, cfg Config) {
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	if got := read(t, ctx, r); got.token != fence.None {
		t.Fatalf("a fresh resource reads token %d; want none (0)", got.token)
	}
	mustWrite(t, ctx, r, 5, "fresh")
	mustWrite(t, ctx, r, 6, "next")
	mustWrite(t, ctx, r, 1<<40, "far ahead")
	// The newest is now 1<<40: what it replaced is stale.
	if err := r.Write(ctx, 6, value("stale")); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Write(token 6) after token %d = %v; want fence.ErrStaleToken", fence.Token(1<<40), err)
	}
}

func testMissing(t *testing.T, cfg Config) {
	need(t, cfg, Missing, cfg.NewMissing != nil)
	ctx := ctxT(t, cfg)
	r := cfg.NewMissing(t)
	// Token 1 is older than anything: a guard that reads "nothing
	// written" as "a newer token is stored" calls it stale.
	for _, tok := range []fence.Token{1, 1 << 40} {
		err := r.Write(ctx, tok, value("missing"))
		switch {
		case err == nil:
			t.Fatalf("Write(token %d) to a missing target = nil; want the guard's not-found error", tok)
		case errors.Is(err, fence.ErrStaleToken):
			t.Fatalf("Write(token %d) to a missing target = %v: reported as stale", tok, err)
		case errors.Is(err, fence.ErrOutcomeUnknown):
			t.Fatalf("Write(token %d) to a missing target = %v: reported as unknown", tok, err)
		case !cfg.IsMissing(err):
			t.Fatalf("Write(token %d) to a missing target = %v; Config.IsMissing does not classify it as missing", tok, err)
		}
	}
}

// zeroWrite writes with fence.None and checks the answer and that nothing
// changed; it returns the requests counted before and after, if counted.
func zeroWrite(t *testing.T, cfg Config, count bool) (before, after int64) {
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	prev := mustWrite(t, ctx, r, 3, "before")
	if count {
		before = cfg.CountIO(r)
	}
	err := r.Write(ctx, fence.None, value("zero"))
	if count {
		after = cfg.CountIO(r)
	}
	switch {
	case !errors.Is(err, fence.ErrInvalidToken):
		t.Fatalf("Write(token 0) = %v; want an error matching fence.ErrInvalidToken", err)
	case errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrOutcomeUnknown):
		t.Fatalf("Write(token 0) = %v: bad input is neither stale nor an unknown outcome", err)
	case !strings.Contains(err.Error(), "token"):
		t.Errorf("Write(token 0) = %q: the message does not say that the token is the problem", err)
	}
	if got := read(t, ctx, r); got != prev {
		t.Fatalf("Write(token 0) changed the resource: read %q with token %d; want %q with token %d", got.value, got.token, prev.value, prev.token)
	}
	return before, after
}

func testZero(t *testing.T, cfg Config) { zeroWrite(t, cfg, false) }

func testZeroBeforeIO(t *testing.T, cfg Config) {
	need(t, cfg, CountIO, cfg.CountIO != nil)
	if before, after := zeroWrite(t, cfg, true); after != before {
		t.Fatalf("Write(token 0) sent %d requests to the store; want it refused before any I/O", after-before)
	}
}

func testLostReply(t *testing.T, cfg Config) {
	need(t, cfg, LoseReply, cfg.LoseReply != nil)
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	prev := mustWrite(t, ctx, r, 10, "before")
	cfg.LoseReply(t, r)
	v := value("lost reply")
	err := r.Write(ctx, 11, v)
	applied := state{v, 11}
	got := read(t, ctx, r)
	if again := read(t, ctx, r); again != got {
		t.Fatalf("two reads after the write returned disagree: %q/%d, then %q/%d", got.value, got.token, again.value, again.token)
	}
	if got != applied && got != prev {
		t.Fatalf("after the write returned %v: read %q with token %d; want either the write (%q, 11) or the state before it (%q, 10)", err, got.value, got.token, v, prev.value)
	}
	switch outcome, _ := Classify(err); outcome {
	case fence.Accepted:
		// The guard settled the outcome with the store (for example by
		// finding its own write there): success must then be true.
		if got != applied {
			t.Fatalf("the write was reported as applied, but the store holds %q with token %d", got.value, got.token)
		}
		t.Logf("the guard learned that the write landed and reported success")
	case fence.Unknown:
		t.Logf("reported as unknown (%v); the write was applied: %v", err, got == applied)
	default:
		t.Fatalf("a write whose reply was lost after the store applied it returned %v (%s); want an error matching fence.ErrOutcomeUnknown, or success if the guard learned that it landed", err, outcome)
	}
	// The store works again, and the token read is the newest: an older
	// one is stale, the same one accepted.
	if err := r.Write(ctx, got.token-1, value("stale")); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Write(token %d) after the lost reply = %v; want fence.ErrStaleToken", got.token-1, err)
	}
	mustWrite(t, ctx, r, got.token, "after")
}

func testConcurrent(t *testing.T, cfg Config) {
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	init := mustWrite(t, ctx, r, 2, "initial")
	// Tokens from a small window, so that writers collide, many writes
	// are stale, and equal tokens occur (the same holder writing again).
	spread := uint64(4 * cfg.Writers)
	start := time.Now()
	ops := make([][]Op, cfg.Writers)
	failures := make([]error, cfg.Writers) // each writer's first plain failure
	var wg sync.WaitGroup
	for w := range cfg.Writers {
		wg.Go(func() {
			for i := range cfg.WritesPerWriter {
				// Rising slowly, with a random spread wider than the
				// rise, so that most writes race a newer one.
				tok := fence.Token(1 + 2*uint64(i) + rand.Uint64N(spread))
				v := value(fmt.Sprintf("w%d/%d token %d", w, i, tok))
				call := time.Since(start)
				err := r.Write(ctx, tok, v)
				ret := time.Since(start)
				outcome, cur := Classify(err)
				ops[w] = append(ops[w], Op{Token: tok, Value: v, Call: call, Return: ret, Outcome: outcome, Current: cur})
				if outcome == fence.Failed && failures[w] == nil {
					failures[w] = err
				}
				if outcome == fence.Failed && ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	final := read(t, ctx, r)
	h := History{Initial: init.token, InitialValue: init.value, Final: final.token, FinalValue: final.value}
	counts := map[fence.Outcome]int{}
	for _, o := range ops {
		for _, op := range o {
			counts[op.Outcome]++
		}
		h.Ops = append(h.Ops, o...)
	}
	t.Logf("%d writes: %d accepted, %d stale, %d unknown, %d failed; final token %d",
		len(h.Ops), counts[fence.Accepted], counts[fence.Rejected], counts[fence.Unknown], counts[fence.Failed], final.token)
	if err := CheckHistory(h); err != nil {
		t.Errorf("the history is not linearizable:\n%v", err)
	}
	if counts[fence.Accepted] == 0 {
		t.Errorf("no write was accepted: the check proved nothing")
	}
	// A plain failure is allowed (a guard may give up under contention,
	// having written nothing), but worth seeing.
	for w, err := range failures {
		if err != nil {
			t.Logf("writer %d: a write failed (taken as not applied): %v", w, err)
		}
	}
}

type writeKey struct{}

func testObserver(t *testing.T, cfg Config) {
	need(t, cfg, Observer, cfg.Observe != nil)
	ctx := ctxT(t, cfg)
	r := cfg.NewResource(t)
	rec := &Recorder{}
	want := cfg.Observe(t, r, rec)
	if want.Guard == "" || want.Class == "" || want.Op == "" {
		t.Fatalf("Config.Observe says the events carry guard %q, class %q, op %q: each must be set (metric labels)", want.Guard, want.Class, want.Op)
	}
	for i, w := range []struct {
		token fence.Token
		want  fence.Outcome
	}{
		{5, fence.Accepted},
		{5, fence.Accepted}, // the same holder again
		{3, fence.Rejected},
		{fence.None, fence.Failed},
		{6, fence.Accepted},
	} {
		call := context.WithValue(ctx, writeKey{}, i)
		err := r.Write(call, w.token, value("observed"))
		if got := fence.OutcomeOf(err); got != w.want {
			t.Fatalf("Write(token %d) = %v (%s); want %s", w.token, err, got, w.want)
		}
		ev := want
		ev.Token, ev.Outcome = w.token, w.want
		e := rec.One(t, ev, err)
		if e.Ctx.Value(writeKey{}) != i {
			t.Fatalf("Write(token %d): the event does not carry the write's context", w.token)
		}
	}
}

func testSetup(t *testing.T, cfg Config) {
	need(t, cfg, Setup, cfg.Check != nil && cfg.NewBroken != nil)
	ctx := ctxT(t, cfg)
	if err := cfg.Check(ctx, cfg.NewResource(t)); err != nil {
		t.Fatalf("the start-up check of a store set up for the guard = %v; want nil", err)
	}
	r := cfg.NewBroken(t)
	WantSetup(t, "the start-up check of a store not set up", cfg.Check(ctx, r), nil)
	WantSetup(t, "a write to a store not set up", r.Write(ctx, 5, value("broken")), nil)
}
