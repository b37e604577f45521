package leasetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The check of a release whose reply is lost: the store applied it, the
// client never heard, and the request is sent again.

// ReplyFault is a fault in the network between a backend and its store.
// Armed, it lets the next release request of ReplyLoss.Name reach the
// store and be applied, then loses its reply with the connection, as a
// network that failed at that moment would; the store's client, or the
// backend, sends the request again on a new connection. A wire wrapping
// the client's connections, or a proxy in front of the store, that
// recognises the release request by the store's protocol is one.
type ReplyFault interface {
	// Arm makes the fault lose the reply to the next release request.
	Arm()
	// Cuts returns how many replies the fault has lost so far.
	Cuts() int64
}

// ReplyLoss is what a backend's tests give CheckReleaseReplyLost.
type ReplyLoss struct {
	// Backend reaches the store through Fault. Required.
	Backend lease.Backend
	// Other reaches the same namespace of the store without the fault, as
	// another client: the next holder. Required.
	Other lease.Backend
	// Fault loses the replies to Backend's release requests of Name.
	// Required.
	Fault ReplyFault
	// Name is the lease name the check takes and releases.
	Name string
	// TTL is the TTL of the check's Managers.
	TTL time.Duration
}

// releaseReplyRounds is how many releases through Manager.Release lose
// their reply.
const releaseReplyRounds = 3

// CheckReleaseReplyLost checks that a clean release whose reply is lost,
// and which is sent again, is a release, every time: a resent release
// finds the name already freed by its first copy, and must answer what
// that copy did (a release), not "not held". In each of three rounds, a
// lease of rl.Name is taken through a Manager over rl.Backend and
// released with the fault armed:
//
//   - exactly one reply was lost (else the round proves nothing);
//   - Release returns nil and the lease's Err is lease.ErrReleased;
//   - the Manager's Observer saw one clean release for the round and no
//     loss;
//   - the name is free at once: no holder at the store (when the backend
//     is a driver.Inspector), and another client's TryAcquire, through
//     rl.Other, gets it.
//
// Then Manager.Run of a job that succeeds, its release's reply lost,
// returns nil, and the Observer still saw no loss nor failed release.
func CheckReleaseReplyLost(t *testing.T, rl ReplyLoss) {
	t.Helper()
	switch {
	case rl.Backend == nil, rl.Other == nil, rl.Fault == nil:
		t.Fatal("leasetest: ReplyLoss needs Backend, Other and Fault")
	case rl.Name == "":
		t.Fatal("leasetest: ReplyLoss.Name is empty")
	}
	obs := &endLog{}
	m := newManager(t, rl.Backend, rl.TTL, lease.WithObserver(obs))
	other := newManager(t, rl.Other, rl.TTL)
	for round := 1; round <= releaseReplyRounds; round++ {
		l, err := m.TryAcquire(ctxT(t), rl.Name)
		if err != nil {
			t.Fatalf("round %d: TryAcquire: %v", round, err)
		}
		cuts := rl.Fault.Cuts()
		rl.Fault.Arm()
		err = l.Release(ctxT(t))
		if n := rl.Fault.Cuts() - cuts; n != 1 {
			t.Fatalf("round %d: the fault lost %d replies during Release, want 1: the round proves nothing", round, n)
		}
		if err != nil {
			t.Errorf("round %d: Release whose reply was lost = %v, want nil", round, err)
		}
		if !errors.Is(l.Err(), lease.ErrReleased) {
			t.Errorf("round %d: the lease's Err after Release = %v, want ErrReleased", round, l.Err())
		}
		if lost, released, last := obs.counts(); lost > 0 || last != nil || released != round {
			t.Fatalf("round %d: the Manager observed %d losses and %d releases (last failure: %v); want no loss and %d clean releases",
				round, lost, released, last, round)
		}
		if in, ok := rl.Backend.(driver.Inspector); ok {
			if h, err := in.Holder(ctxT(t), rl.Name); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("round %d: after the release the name must be free; Holder = %+v, %v", round, h, err)
			}
		}
		l2, err := other.TryAcquire(ctxT(t), rl.Name)
		if err != nil {
			t.Fatalf("round %d: another client's TryAcquire after the release: %v", round, err)
		}
		if err := l2.Release(ctxT(t)); err != nil {
			t.Fatalf("round %d: another client's Release: %v", round, err)
		}
	}

	cuts := rl.Fault.Cuts()
	ran := false
	err := m.Run(ctxT(t), rl.Name, func(context.Context, *lease.Lease) error {
		ran = true
		rl.Fault.Arm() // the release that Run sends
		return nil
	})
	if n := rl.Fault.Cuts() - cuts; !ran || n != 1 {
		t.Fatalf("Run: the job ran %v and the fault lost %d replies, want 1: the check proves nothing", ran, n)
	}
	if err != nil {
		t.Errorf("Run of a job that succeeded, its release's reply lost = %v, want nil", err)
	}
	if lost, _, last := obs.counts(); lost > 0 || last != nil {
		t.Fatalf("Run: the Manager observed %d losses (last failure: %v), want none", lost, last)
	}
}

// endLog counts the losses and releases a Manager reports, and keeps the
// error of the last loss or failed release.
type endLog struct {
	lease.NopObserver
	mu       sync.Mutex
	lost     int
	released int
	last     error
}

func (o *endLog) Lost(e lease.LostEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lost++
	o.last = e.Err
}

func (o *endLog) Released(e lease.ReleasedEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.released++
	if e.Err != nil {
		o.last = e.Err
	}
}

// counts returns the losses, the releases (clean or not), and the error of
// the last loss or failed release (nil when there was none).
func (o *endLog) counts() (lost, released int, last error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lost, o.released, o.last
}
