package etcdlease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// A release resent after a lost reply replays the first one's answer: a
// lease lost at the store (its key deleted) whose Release reply is lost
// and resent stays lost, never a false release. A round in which the
// Manager learned of the loss before Release (from its watch), so that
// Release sent nothing, proves nothing: it must still report the loss, and
// the test goes on until three rounds have had a release's reply lost.
func TestReleaseOfALostLeaseWithALostReplyIsStillALoss(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	p := prefix(t)
	loss, endpoint := replyLoss(t, cl, p, "job")
	b := newBackend(t, cl.Client(endpoint), p)
	m := testkit.NewManager(t, b, 3*time.Second)
	exercised := 0
	for round := 1; exercised < 3; round++ {
		if round > 20 {
			t.Fatalf("only %d of 20 rounds lost a release's reply: the Manager learned of the loss first in the others", exercised)
		}
		l, err := m.TryAcquire(testkit.Context(t), "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Client().Delete(testkit.Context(t), b.Key("job")); err != nil {
			t.Fatal(err)
		}
		drops := loss.Cuts()
		loss.Arm()
		err = l.Release(testkit.Context(t))
		loss.Disarm()
		lostReply := loss.Cuts() > drops
		if lostReply {
			exercised++
		}
		t.Logf("round %d: Release of a lease whose key was deleted (its reply lost: %v) = %v; Err=%v", round, lostReply, err, l.Err())
		if !errors.Is(err, lease.ErrLost) {
			t.Errorf("round %d: FALSE RELEASE: want ErrLost, got %v", round, err)
		}
	}
}

// The same at the backend: a resent Release of a grant that was gone when
// the first one arrived answers ErrNotHeld again (the ended record says
// "lost"), while the same Release without a fault answers ErrNotHeld too.
func TestResentReleaseOfAGoneGrantIsStillNotHeld(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	p := prefix(t)
	loss, endpoint := replyLoss(t, cl, p, "job")
	b := newBackend(t, cl.Client(endpoint), p)
	for round := 1; round <= 3; round++ {
		g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "job", Owner: "o" + string(rune('0'+round)), TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Client().Delete(testkit.Context(t), b.Key("job")); err != nil {
			t.Fatal(err)
		}
		drops := loss.Cuts()
		loss.Arm()
		err = b.Release(testkit.Context(t), g)
		if loss.Cuts() == drops {
			t.Fatal("the proxy dropped no reply: the test did not exercise a resent release")
		}
		t.Logf("round %d: backend Release of a deleted grant, reply lost = %v", round, err)
		if !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("round %d: FALSE RELEASE: want ErrNotHeld, got %v", round, err)
		}
		// The same without a fault.
		g, _ = b.Acquire(testkit.Context(t), driver.Request{Name: "job", Owner: "c" + string(rune('0'+round)), TTL: 3 * time.Second})
		_, _ = cl.Client().Delete(testkit.Context(t), b.Key("job"))
		if err := b.Release(testkit.Context(t), g); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("round %d, no fault: Release of a deleted grant = %v, want ErrNotHeld", round, err)
		}
	}
}
