// Package checktest is the conformance suite every fencecheck.Checker must
// pass, against its real store. It is the guard contract (package
// guardtest) for a resource that holds only a token:
//
//   - StaleIsRejected: a token older than the newest accepted is refused
//     with a *fence.StaleError naming the resource, the presented and the
//     current token, and the newest token is unchanged.
//   - EqualAndGreaterAreAccepted: the holder of the newest token checks
//     again; a newer token becomes the newest, up to 2^63-1.
//   - LargeTokensFitOrAreOutOfRange: every token up to Config.MaxToken
//     (2^64-1 unless the checker documents less) is accepted and stored
//     exactly; a valid token above it is refused with an error matching
//     fencecheck.ErrTokenRange (not fence.ErrInvalidToken, not stale, not
//     unknown), nothing changed, and a receiver (fencewire.Admit) answers
//     it with fencewire.ProblemTokenRange (422), never as malformed.
//   - BadInputIsRefused: token 0 (fence.ErrInvalidToken) and an empty
//     resource name (fencecheck.ErrInvalidResource) change nothing.
//   - ResourcesAreIndependent: a token accepted for one resource says
//     nothing about another, even one whose name differs only in case or
//     in a hash tag's braces.
//   - ConcurrentChecksAreLinearizable: goroutines check random tokens
//     from a narrow window against one resource; the history of calls,
//     answers and a final read must pass guardtest.CheckHistory (with no
//     values: a checker stores only the token).
package checktest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/guardtest"
)

// Config describes the checker under test.
type Config struct {
	// New returns the checker under test and a way to read the newest
	// token it has accepted for a resource from its store (fence.None for
	// none). Called once per check, from the check's goroutine. Required.
	New func(t *testing.T) (c fencecheck.Checker, current func(ctx context.Context, resource string) (fence.Token, error))
	// MaxToken is the largest token the checker stores, as it documents;
	// it must refuse a larger one with fencecheck.ErrTokenRange. Zero:
	// 2^64-1 (every token).
	MaxToken fence.Token
	// Checkers and ChecksPerChecker size the concurrent check. Defaults 4
	// and 50.
	Checkers, ChecksPerChecker int
	// Timeout bounds each check's calls. Default 2 minutes.
	Timeout time.Duration
}

// Run runs the suite as parallel subtests of t. Every resource name it
// uses is unique to the run (random), so checkers may share a store.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.New == nil {
		t.Fatal("checktest: Config.New is nil")
	}
	if cfg.Checkers <= 0 {
		cfg.Checkers = 4
	}
	if cfg.ChecksPerChecker <= 0 {
		cfg.ChecksPerChecker = 50
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.MaxToken == fence.None {
		cfg.MaxToken = math.MaxUint64
	}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Config)
	}{
		{"StaleIsRejected", testStale},
		{"EqualAndGreaterAreAccepted", testEqualGreater},
		{"LargeTokensFitOrAreOutOfRange", testLargeTokens},
		{"BadInputIsRefused", testBadInput},
		{"ResourcesAreIndependent", testIndependent},
		{"ConcurrentChecksAreLinearizable", testConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, cfg)
		})
	}
}

type fixture struct {
	t       *testing.T
	ctx     context.Context
	c       fencecheck.Checker
	current func(context.Context, string) (fence.Token, error)
}

func setup(t *testing.T, cfg Config) *fixture {
	ctx, cancel := context.WithTimeout(t.Context(), cfg.Timeout)
	t.Cleanup(cancel)
	c, cur := cfg.New(t)
	return &fixture{t: t, ctx: ctx, c: c, current: cur}
}

// resource returns a name unique to this run, with characters that break
// SQL text, Redis hash tags and encodings.
func resource(tag string) string {
	return fmt.Sprintf(`%s/%016x {tag} it's "x"; -- \ é ✓`, tag, rand.Uint64())
}

func (f *fixture) read(r string) fence.Token {
	f.t.Helper()
	tok, err := f.current(f.ctx, r)
	if err != nil {
		f.t.Fatalf("read the current token of %q: %v", r, err)
	}
	return tok
}

func (f *fixture) accept(r string, tok fence.Token) {
	f.t.Helper()
	if err := f.c.Check(f.ctx, r, tok); err != nil {
		f.t.Fatalf("Check(%q, %d) = %v; want it accepted", r, tok, err)
	}
	if got := f.read(r); got != tok {
		f.t.Fatalf("after Check(%q, %d) was accepted the store holds %d", r, tok, got)
	}
}

func testStale(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	r := resource("stale")
	f.accept(r, 100)
	for _, tok := range []fence.Token{99, 1} {
		err := f.c.Check(f.ctx, r, tok)
		se, ok := fence.AsStale(err)
		switch {
		case !errors.Is(err, fence.ErrStaleToken) || !ok:
			t.Fatalf("Check(%d) after 100 = %v; want a *fence.StaleError", tok, err)
		case errors.Is(err, fence.ErrOutcomeUnknown):
			t.Fatalf("Check(%d) = %v: a rejection is not an unknown outcome", tok, err)
		case se.Resource != r || se.Presented != tok || se.Current != 100:
			t.Fatalf("StaleError = %+v; want resource %q, presented %d, current 100", se, r, tok)
		}
		if got := f.read(r); got != 100 {
			t.Fatalf("a stale check changed the token to %d", got)
		}
	}
}

func testEqualGreater(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	r := resource("greater")
	if got := f.read(r); got != fence.None {
		t.Fatalf("a fresh resource holds token %d", got)
	}
	f.accept(r, 5)
	f.accept(r, 5)
	f.accept(r, 6)
	f.accept(r, 1<<40)
	f.accept(r, 1<<63-1)
	if err := f.c.Check(f.ctx, r, 1<<40); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check(2^40) after 2^63-1 = %v; want stale", err)
	}
}

func testLargeTokens(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	r := resource("large")
	f.accept(r, 5)
	newest := fence.Token(5)
	for _, tok := range []fence.Token{1<<53 + 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, 1<<64 - 2, 1<<64 - 1} {
		if tok <= cfg.MaxToken {
			f.accept(r, tok)
			newest = tok
			continue
		}
		err := f.c.Check(f.ctx, r, tok)
		switch {
		case !errors.Is(err, fencecheck.ErrTokenRange):
			t.Errorf("Check(%d), above the checker's MaxToken %d = %v; want fencecheck.ErrTokenRange", tok, cfg.MaxToken, err)
		case errors.Is(err, fence.ErrInvalidToken) || errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrOutcomeUnknown):
			t.Errorf("Check(%d) = %v; a valid token out of the checker's range is neither invalid, stale nor unknown", tok, err)
		}
		if got := f.read(r); got != newest {
			t.Fatalf("a token out of range changed the stored token from %d to %d", newest, got)
		}
		// What a receiver answers: the distinct problem, never "malformed".
		field, ferr := fencewire.Format(fencewire.Value{Resource: r, Token: tok})
		if ferr != nil {
			t.Fatalf("Format(%d): %v", tok, ferr)
		}
		_, ok, refusal, checkErr := fencewire.Admit(f.ctx, []string{field}, true, f.c)
		switch {
		case ok || refusal == nil:
			t.Errorf("a receiver admitted token %d, above the checker's MaxToken %d", tok, cfg.MaxToken)
		case refusal.Type != fencewire.ProblemTokenRange || refusal.Status != 422 || checkErr != nil:
			t.Errorf("a receiver answers token %d with %+v (check error %v); want %s, 422", tok, *refusal, checkErr, fencewire.ProblemTokenRange)
		case !errors.Is(refusal.Err(), fencecheck.ErrTokenRange) || !errors.Is(refusal.Err(), fencewire.ErrRejected) || errors.Is(refusal.Err(), fencewire.ErrMalformed):
			t.Errorf("the client's error for token %d = %v; want fencewire.ErrRejected and fencecheck.ErrTokenRange, not malformed", tok, refusal.Err())
		case refusal.Resource != r || refusal.Presented != tok.String():
			t.Errorf("the refusal of token %d names %q, %q; want the resource and the token", tok, refusal.Resource, refusal.Presented)
		}
		if got := f.read(r); got != newest {
			t.Fatalf("a refused token changed the stored token from %d to %d", newest, got)
		}
	}
}

func testBadInput(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	r := resource("bad")
	f.accept(r, 3)
	if err := f.c.Check(f.ctx, r, fence.None); !errors.Is(err, fence.ErrInvalidToken) || errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("Check(token 0) = %v; want fence.ErrInvalidToken only", err)
	}
	if err := f.c.Check(f.ctx, "", 1); !errors.Is(err, fencecheck.ErrInvalidResource) {
		t.Errorf("Check(\"\", 1) = %v; want fencecheck.ErrInvalidResource", err)
	}
	if err := f.c.Check(f.ctx, "\xff\xfe", 1); !errors.Is(err, fencecheck.ErrInvalidResource) {
		t.Errorf("Check(not UTF-8, 1) = %v; want fencecheck.ErrInvalidResource", err)
	}
	if got := f.read(r); got != 3 {
		t.Errorf("bad input changed the token to %d", got)
	}
}

func testIndependent(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	base := fmt.Sprintf("indep/%016x", rand.Uint64())
	names := []string{base + "/a", base + "/A", "{" + base + "}/a", base + "/a "}
	for i, n := range names {
		f.accept(n, fence.Token(10*(len(names)-i)))
	}
	for i, n := range names {
		if got, want := f.read(n), fence.Token(10*(len(names)-i)); got != want {
			t.Errorf("%q holds %d; want %d", n, got, want)
		}
	}
}

func testConcurrent(t *testing.T, cfg Config) {
	f := setup(t, cfg)
	r := resource("concurrent")
	f.accept(r, 2)
	spread := uint64(4 * cfg.Checkers)
	start := time.Now()
	ops := make([][]guardtest.Op, cfg.Checkers)
	var wg sync.WaitGroup
	for w := range cfg.Checkers {
		wg.Go(func() {
			for i := range cfg.ChecksPerChecker {
				tok := fence.Token(1 + 2*uint64(i) + rand.Uint64N(spread))
				call := time.Since(start)
				err := f.c.Check(f.ctx, r, tok)
				ret := time.Since(start)
				outcome, cur := guardtest.Classify(err)
				ops[w] = append(ops[w], guardtest.Op{Token: tok, Call: call, Return: ret, Outcome: outcome, Current: cur})
				if outcome == fence.Failed && f.ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	h := guardtest.History{Initial: 2, Final: f.read(r)}
	counts := map[fence.Outcome]int{}
	for _, o := range ops {
		for _, op := range o {
			counts[op.Outcome]++
		}
		h.Ops = append(h.Ops, o...)
	}
	t.Logf("%d checks: %d accepted, %d stale, %d unknown, %d failed; final token %d",
		len(h.Ops), counts[fence.Accepted], counts[fence.Rejected], counts[fence.Unknown], counts[fence.Failed], h.Final)
	if err := guardtest.CheckHistory(h); err != nil {
		t.Errorf("the history is not linearizable:\n%v", err)
	}
	if counts[fence.Accepted] == 0 || counts[fence.Rejected] == 0 {
		t.Errorf("the checks were not both accepted and rejected: the check proved little")
	}
}
