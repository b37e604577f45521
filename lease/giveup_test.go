package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// answerOnceBackend answers the first acquire request, then holds every
// later one unanswered until its context ends: a store that refused a
// waiter once and then stalled (a loaded server, a failover).
type answerOnceBackend struct {
	*memlease.Backend
	acquires atomic.Int32
}

func (b *answerOnceBackend) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	if b.acquires.Add(1) == 1 {
		return b.Backend.Acquire(ctx, r)
	}
	<-ctx.Done()
	return driver.Grant{}, ctx.Err()
}

// A blocking Acquire whose context ends while an attempt is in flight,
// after the store had refused an earlier one, still names the holder: the
// refusal leads the error (a *NotAcquiredError naming owner and token),
// followed by the cut attempt and the context's error. Before, only the
// cut attempt was reported ("last attempt: context deadline exceeded"),
// and whether the holder was named depended on how fast the store
// answered.
func TestAcquireGivingUpMidAttemptNamesTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memlease.New()
		holderM, err := lease.NewManager(mem, 10*time.Second, lease.WithIdentity("holder"))
		if err != nil {
			t.Fatal(err)
		}
		held, err := holderM.TryAcquire(t.Context(), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(context.Background())

		b := &answerOnceBackend{Backend: mem}
		m, err := lease.NewManager(b, 10*time.Second, lease.WithIdentity("waiter"), lease.WithPollInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err = m.Acquire(ctx, "jobs")
		if n := b.acquires.Load(); n < 2 {
			t.Fatalf("%d acquire requests; the test needs a refusal and then a stalled attempt", n)
		}
		var na *lease.NotAcquiredError
		if !errors.As(err, &na) || na.Holder.Owner != held.Owner() || na.Holder.Token != held.Token() {
			t.Fatalf("Acquire = %v; want a NotAcquiredError naming owner %q, token %d", err, held.Owner(), held.Token())
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "in flight") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Acquire = %q; want one line that also names the attempt cut short and matches context.DeadlineExceeded", err)
		}
	})
}
