package consensus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/guarded"
	"github.com/fencekit/fencekit/internal/rig/holder"
	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
)

// A holder process frozen with SIGSTOP between checking its lease and
// writing: when the pause outlasts its grant, another client takes the
// lease and writes, and the frozen holder's writes, once it is resumed,
// are rejected as stale at PostgreSQL and S3; when the pause is well within
// its grant, it keeps the lease and its writes land.
func TestPausedHolderRejectedAtStores(t *testing.T) {
	const ttl = 2 * time.Second
	for _, c := range []struct {
		pause time.Duration
		stale bool
	}{
		{pause: ttl * 3 / 10, stale: false},
		{pause: ttl + 500*time.Millisecond, stale: true},
		{pause: 2*ttl + time.Second, stale: true},
	} {
		t.Run(fmt.Sprintf("pause=%v", c.pause), func(t *testing.T) {
			testPausedHolder(t, ttl, c.pause, c.stale)
		})
	}
}

func testPausedHolder(t *testing.T, ttl, pause time.Duration, stale bool) {
	ctx := testkit.Context(t)
	res, drop, err := guarded.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(context.Background()) })
	cl := etcdCluster(t)
	p := etcdPrefix(t)
	resJSON, _ := json.Marshal(res)
	a := itest.StartHolder(t, "-store", "etcd", "-do", "commands", "-endpoints", strings.Join(cl.Endpoints(), ","), "-prefix", p, "-name", "job",
		"-ttl", ttl.String(), "-min-ttl", "1s", "-resource", string(resJSON))
	acq := a.Next("acquired", 30*time.Second)
	a.Next("renewed", 10*ttl)
	a.Send("check")
	if chk := a.Next("checked", 10*time.Second); !chk.Valid {
		t.Fatalf("the holder's lease was not valid at its check: %s", chk.Text)
	}
	// Frozen right after its check, before its write.
	stopped := a.Signal(syscall.SIGSTOP)
	bM := testkit.NewManager(t, newEtcdBackend(t, cl.Client(), p), ttl)
	var lb *lease.Lease
	if stale {
		lb, err = bM.Acquire(ctx, "job")
		if err != nil {
			t.Fatalf("B's Acquire while A is frozen: %v", err)
		}
		t.Logf("A (token %d) frozen; B acquired %v later with token %d", acq.Token, time.Since(stopped).Round(time.Millisecond), lb.Token())
		if lb.Token() <= acq.Token {
			t.Fatalf("B's token %d <= A's %d", lb.Token(), acq.Token)
		}
		for _, w := range guarded.Write(ctx, res, "B", lb.Token()) {
			if !w.Accepted {
				t.Fatalf("B's write to %s: %s", w.Store, w.Err)
			}
		}
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	if !stale {
		if _, err := bM.TryAcquire(ctx, "job"); err == nil {
			t.Fatal("B acquired the lease while A, frozen for less than its TTL, held it")
		}
	}
	a.Signal(syscall.SIGCONT)
	a.Send("write")
	for range 2 {
		w := a.Next(holder.KindWrite, 30*time.Second)
		switch {
		case stale && w.Outcome != holder.Stale:
			t.Errorf("A's write to %s after a pause of %v (TTL %v): %s (%s); want rejected as stale", w.Store, pause, ttl, w.Outcome, w.Text)
		case !stale && w.Outcome != holder.Accepted:
			t.Errorf("A's write to %s after a pause of %v, within its TTL %v: %s (%s); want accepted", w.Store, pause, ttl, w.Outcome, w.Text)
		}
	}
	rowBy, rowTok, objBy, objTok, err := guarded.Stored(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	want, wantTok := "A", acq.Token
	if stale {
		want, wantTok = "B", lb.Token()
	}
	if rowBy != want || rowTok != wantTok || objBy != want || objTok != wantTok {
		t.Fatalf("stored: row by %q (token %d), object by %q (token %d); want %s's with token %d", rowBy, rowTok, objBy, objTok, want, wantTok)
	}
	a.Send("exit")
	if lb != nil {
		_ = lb.Release(ctx)
	}
}
