package guardtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Ledger is what lease.Ledger is (guardtest does not import lease): the
// record of once-per-period jobs' runs that a guard keeps in its store.
type Ledger interface {
	Claim(ctx context.Context, job, key string, token fence.Token) (done bool, err error)
	MarkDone(ctx context.Context, job, key string, token fence.Token) error
}

// DoneWithJob is the capability of a ledger whose done mark can be
// written in the job's own transaction (LedgerConfig.MarkDoneWithJob).
const DoneWithJob Capability = "done-with-job"

// LedgerConfig describes the ledger under test.
type LedgerConfig struct {
	// NewLedger returns a ledger over a store set up for it, isolated
	// from every other check's (its own table or database), registering
	// its cleanup with t. Required.
	NewLedger func(t *testing.T) Ledger

	// MarkDoneWithJob marks job's run key done by token in one
	// transaction with a write of the job's own (sqlguard's MarkDoneTx in
	// the job's transaction, dynamoguard's MarkDoneTransact with the
	// job's items) and commits it, or, with fail set, makes the job's
	// transaction fail after the mark (a rollback, or a write of the
	// job's that cannot commit) so that neither lands; it returns the
	// error of the whole. Nil unless Lacks names DoneWithJob.
	MarkDoneWithJob func(t *testing.T, ctx context.Context, l Ledger, job, key string, token fence.Token, fail bool) error

	// Timeout bounds each check's calls. Default 2 minutes.
	Timeout time.Duration

	// Lacks maps each capability the ledger does not have to the reason.
	Lacks map[Capability]string
}

// RunLedger runs the ledger suite as parallel subtests of t: the
// contract of lease.Ledger (RunOnce runs a job at most once per run key
// across processes) against the real store.
//
//   - FreshRunIsNotDone, DoneIsSeen: a MarkDone of a run never claimed is
//     refused (fence.ErrNotFound); a claim of a new run says not done;
//     after MarkDone, every claim says done, the newer holder's too; a
//     MarkDone again with the same token is harmless.
//   - OlderClaimIsStale, OlderMarkIsStale: once a newer token claimed a
//     run, an older holder's claim and its MarkDone are refused with a
//     *fence.StaleError naming both tokens, and change nothing.
//   - JobsAreKeptApart: two jobs that share the ledger and a run key have
//     runs of their own, and their tokens are never compared.
//   - BadInputIsRefused: an empty job or run key, and the zero token, are
//     refused before the store is asked.
//   - DoneWithTheJob: a done mark written with the job's own transaction
//     lands with it or not at all (capability DoneWithJob).
func RunLedger(t *testing.T, cfg LedgerConfig) {
	t.Helper()
	if cfg.NewLedger == nil {
		t.Fatal("guardtest: LedgerConfig.NewLedger is nil")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, context.Context, LedgerConfig)
	}{
		{"FreshRunIsNotDone", ledgerFresh},
		{"DoneIsSeen", ledgerDone},
		{"OlderClaimIsStale", ledgerOlderClaim},
		{"OlderMarkIsStale", ledgerOlderMark},
		{"JobsAreKeptApart", ledgerJobs},
		{"BadInputIsRefused", ledgerBadInput},
		{"DoneWithTheJob", ledgerWithJob},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), cfg.Timeout)
			defer cancel()
			tc.fn(t, ctx, cfg)
		})
	}
}

// claim claims and fails t unless it gives want.
func claim(t *testing.T, ctx context.Context, l Ledger, job, key string, token fence.Token, want bool) {
	t.Helper()
	done, err := l.Claim(ctx, job, key, token)
	if err != nil || done != want {
		t.Fatalf("Claim(%q, %q, %d) = %v, %v; want %v, nil", job, key, token, done, err, want)
	}
}

// wantStale fails t unless err is a *fence.StaleError presenting
// presented with current current.
func wantStale(t *testing.T, what string, err error, presented, current fence.Token) {
	t.Helper()
	se, ok := fence.AsStale(err)
	if !ok || se.Presented != presented || se.Current != current || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("%s = %v; want a *fence.StaleError presenting %d, current %d", what, err, presented, current)
	}
}

func ledgerFresh(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	if err := l.MarkDone(ctx, "nightly", "2026-12-01", 5); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("MarkDone of a run never claimed = %v; want fence.ErrNotFound", err)
	}
	claim(t, ctx, l, "nightly", "2026-12-01", 5, false)
	claim(t, ctx, l, "nightly", "2026-12-01", 5, false) // the same holder again
	claim(t, ctx, l, "nightly", "2026-12-02", 1, false) // another run: tokens per run
}

func ledgerDone(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	claim(t, ctx, l, "nightly", "night", 5, false)
	if err := l.MarkDone(ctx, "nightly", "night", 5); err != nil {
		t.Fatalf("MarkDone = %v", err)
	}
	if err := l.MarkDone(ctx, "nightly", "night", 5); err != nil {
		t.Fatalf("MarkDone again with the same token = %v; want nil", err)
	}
	claim(t, ctx, l, "nightly", "night", 5, true)
	claim(t, ctx, l, "nightly", "night", 9, true) // the next holder finds it done
}

func ledgerOlderClaim(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	claim(t, ctx, l, "nightly", "night", 7, false)
	done, err := l.Claim(ctx, "nightly", "night", 6)
	wantStale(t, "an older holder's Claim", err, 6, 7)
	if done {
		t.Fatal("a refused claim says done")
	}
	claim(t, ctx, l, "nightly", "night", 7, false)
}

func ledgerOlderMark(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	claim(t, ctx, l, "nightly", "night", 5, false)
	claim(t, ctx, l, "nightly", "night", 7, false) // a successor took over
	wantStale(t, "the paused holder's MarkDone", l.MarkDone(ctx, "nightly", "night", 5), 5, 7)
	claim(t, ctx, l, "nightly", "night", 7, false) // not done: the successor runs it
}

func ledgerJobs(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	claim(t, ctx, l, "invoices", "2026-12-01", 1<<40, false)
	if err := l.MarkDone(ctx, "invoices", "2026-12-01", 1<<40); err != nil {
		t.Fatal(err)
	}
	// Another lease name: its tokens are its own, far lower, and never
	// compared with the first job's.
	claim(t, ctx, l, "reports", "2026-12-01", 3, false)
	if err := l.MarkDone(ctx, "reports", "2026-12-01", 3); err != nil {
		t.Fatalf("the second job's MarkDone = %v", err)
	}
	claim(t, ctx, l, "reports", "2026-12-01", 3, true)
	claim(t, ctx, l, "invoices", "2026-12-01", 1<<40, true)
	claim(t, ctx, l, "settle orders", "2026-12-01", 2, false)
}

func ledgerBadInput(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	l := cfg.NewLedger(t)
	for _, c := range []struct {
		job, key string
		token    fence.Token
		want     error
	}{
		{"", "night", 5, fence.ErrInvalidArgument},
		{"nightly", "", 5, fence.ErrInvalidArgument},
		{"nightly", "night", fence.None, fence.ErrInvalidToken},
	} {
		if _, err := l.Claim(ctx, c.job, c.key, c.token); !errors.Is(err, c.want) || !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("Claim(%q, %q, %d) = %v; want %v", c.job, c.key, c.token, err, c.want)
		}
		if err := l.MarkDone(ctx, c.job, c.key, c.token); !errors.Is(err, c.want) {
			t.Errorf("MarkDone(%q, %q, %d) = %v; want %v", c.job, c.key, c.token, err, c.want)
		}
	}
	claim(t, ctx, l, "nightly", "night", 5, false) // nothing was recorded
}

func ledgerWithJob(t *testing.T, ctx context.Context, cfg LedgerConfig) {
	need(t, Config{Lacks: cfg.Lacks}, DoneWithJob, cfg.MarkDoneWithJob != nil)
	l := cfg.NewLedger(t)
	claim(t, ctx, l, "nightly", "night", 5, false)
	if err := cfg.MarkDoneWithJob(t, ctx, l, "nightly", "night", 5, true); err == nil {
		t.Fatal("a job's transaction that fails returned nil")
	}
	claim(t, ctx, l, "nightly", "night", 5, false) // the mark did not land
	if err := cfg.MarkDoneWithJob(t, ctx, l, "nightly", "night", 5, false); err != nil {
		t.Fatalf("the job's transaction with the mark = %v", err)
	}
	claim(t, ctx, l, "nightly", "night", 5, true)
	claim(t, ctx, l, "nightly", "night", 7, true)
}
