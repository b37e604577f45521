package leasetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// The checks of Manager.Run: the lease held for the work, and a loss
// during it reported.

func testRun(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.long)
	other := newManager(t, s.connect(), s.long)
	n := name(t)
	var (
		ran   bool
		token fence.Token
	)
	boom := errors.New("the job failed")
	err := m.Run(ctxT(t), n, func(ctx context.Context, l *lease.Lease) error {
		ran, token = true, l.Token()
		if tok, ok := fence.FromContext(ctx); !ok || tok != l.Token() {
			t.Errorf("the work's context carries token %d, %v; want %d", tok, ok, l.Token())
		}
		if _, err := other.TryAcquire(ctxT(t), n); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("another holder got the lease while Run's work ran: %v", err)
		}
		if err := other.TryRun(ctxT(t), n, func(context.Context, *lease.Lease) error {
			t.Error("TryRun ran its function while the lease was held")
			return nil
		}); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("TryRun of a held lease = %v, want ErrNotAcquired", err)
		}
		return boom
	})
	if !ran || token == fence.None {
		t.Fatal("Run did not run the work with a token")
	}
	if !errors.Is(err, boom) || errors.Is(err, lease.ErrLost) {
		t.Fatalf("Run = %v, want the work's error alone", err)
	}
	// Released: another holder gets it at once, with a newer token.
	l, err := other.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("the lease was not released after Run: %v", err)
	}
	if l.Token() <= token {
		t.Fatalf("token %d after Run's %d", l.Token(), token)
	}
	_ = l.Release(ctxT(t))
	// The caller's context ends the work.
	ctx, cancel := context.WithCancel(ctxT(t))
	err = m.Run(ctx, n, func(ctx context.Context, _ *lease.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run whose caller cancelled = %v, want context.Canceled", err)
	}
}

func testRunLost(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.short, lease.WithoutAutoRenew())
	n := name(t)
	var workErr error
	err := m.Run(ctxT(t), n, func(ctx context.Context, l *lease.Lease) error {
		select {
		case <-ctx.Done(): // nobody renews: lost at the deadline
			workErr = context.Cause(ctx)
			return nil
		case <-time.After(s.short + 10*time.Second):
			return errors.New("the work's context did not end when the lease was lost")
		}
	})
	var le *lease.LostError
	if !errors.As(err, &le) || le.Reason != lease.LostExpired {
		t.Fatalf("Run of work that outlived its lease = %v, want a LostError (expired)", err)
	}
	if !errors.Is(workErr, lease.ErrLost) {
		t.Fatalf("the work's context cause = %v, want ErrLost", workErr)
	}
}
