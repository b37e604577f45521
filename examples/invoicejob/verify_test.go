package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
)

// fakeRows is a row store held in memory, for the verifier's checks: read
// returns s, replay answers with replayErr (and, when that is nil, writes
// like an unguarded store would).
type fakeRows struct {
	s         stored
	replayErr func(tok fence.Token) error
}

func (f *fakeRows) where() string { return "fake" }

func (f *fakeRows) step(context.Context, fence.Token, string, time.Duration, func(int, bool)) (stepResult, error) {
	return stepResult{}, errors.New("not used")
}

func (f *fakeRows) replay(_ context.Context, tok fence.Token, replica string, at int) error {
	if err := f.replayErr(tok); err != nil {
		return err
	}
	f.s.invoices[at].LockVersion, f.s.invoices[at].WrittenBy = tok, replica
	return nil
}

func (f *fakeRows) read(context.Context) (stored, error) {
	s := f.s
	s.invoices = append([]invoice(nil), f.s.invoices...)
	return s, nil
}

// TestVerifyChecks feeds the verifier a store that holds a correct outcome,
// then the same with one fault each, and checks that exactly the check
// that sees the fault fails (so that a check can fail, whatever the store).
func TestVerifyChecks(t *testing.T) {
	const n = 6
	tokA, tokB, tokC := fence.Token(10), fence.Token(20), fence.Token(30)
	good := func() *fakeRows {
		f := &fakeRows{s: stored{next: n, completed: true, progressTok: tokB, resource: tokC}}
		for i := range n {
			by, tok := "replica-1", tokA
			if i >= 2 {
				by, tok = "replica-2", tokB
			}
			f.s.invoices = append(f.s.invoices, invoice{Customer: fmt.Sprintf("cust-%05d", i+1), Number: i + 1, WrittenBy: by, LockVersion: tok})
		}
		f.replayErr = func(tok fence.Token) error { return fence.Stale("invoices/2026-11", tok, tokC) }
		return f
	}
	for _, tc := range []struct {
		name  string
		fault func(f *fakeRows)
		fails string // the failing check's text contains this; "" for none
	}{
		{"correct", func(*fakeRows) {}, ""},
		{"an invoice lost", func(f *fakeRows) { f.s.invoices = f.s.invoices[:n-1] }, "1 missing"},
		{"an invoice under a token nobody held", func(f *fakeRows) { f.s.invoices[4].LockVersion = 25 }, "lock_version is the token"},
		{"the newer holder wrote first", func(f *fakeRows) {
			f.s.invoices[0].LockVersion, f.s.invoices[0].WrittenBy = tokB, "replica-2"
		}, "in token order"},
		{"progress incomplete", func(f *fakeRows) { f.s.completed = false }, "progress row is complete"},
		{"resource behind", func(f *fakeRows) { f.s.resource = tokB }, "the newest holder's"},
		{"a stale write accepted", func(f *fakeRows) { f.replayErr = func(fence.Token) error { return nil } }, "rejected as stale"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := good()
			tc.fault(f)
			sc := &scenario{rows: f}
			for i := range n {
				sc.customers = append(sc.customers, customer{ID: fmt.Sprintf("cust-%05d", i+1)})
			}
			o := options{replicas: 3, customers: n, kills: 0, period: "2026-11", Flags: demo.Flags{TTL: time.Second}}
			sum := &summary{Holders: []*holder{
				{Replica: "replica-1", Token: tokA, ResumedAt: 0, Fate: evKilled, KilledAt: time.Now()},
				{Replica: "replica-2", Token: tokB, ResumedAt: 2, Fate: evCompleted},
				{Replica: "replica-3", Token: tokC, ResumedAt: n, Fate: evNothing},
			}}
			if err := sc.verify(context.Background(), demo.NewTimeline(io.Discard), o, sum); err != nil {
				t.Fatal(err)
			}
			var failed []string
			for _, c := range sum.Checks {
				if !c.OK {
					failed = append(failed, c.Text)
				}
			}
			switch {
			case tc.fails == "" && len(failed) > 0:
				t.Errorf("checks failed on a correct outcome: %q", failed)
			case tc.fails != "" && (len(failed) == 0 || !strings.Contains(strings.Join(failed, "\n"), tc.fails)):
				t.Errorf("failed checks %q; want one with %q", failed, tc.fails)
			}
			if sum.OK != (tc.fails == "") {
				t.Errorf("verdict ok %v: %s", sum.OK, sum.Verdict)
			}
		})
	}
}
