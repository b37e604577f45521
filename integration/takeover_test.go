package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// TestTakeoverAfterSIGKILL kills a lease holder process with SIGKILL (its
// lease is never released) while a second process waits in Acquire, and
// measures the takeover: the time from the kill to the second process's
// grant. The waiter must get the lease within TTL + one renew interval of
// the kill (the dead holder's grant has at most a TTL left; a waiter
// retries right at its expiry), and never before the grant the dead holder
// last renewed could have expired at the store. Each TTL runs with the kill
// at a few points of the renew cycle.
func TestTakeoverAfterSIGKILL(t *testing.T) {
	rc := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	// Slack for a loaded machine (two shared cores, the race detector in
	// the test process): the bound is checked as TTL + renew interval +
	// slack.
	const slack = 500 * time.Millisecond
	ttls := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}
	phases := []float64{0.1, 0.5, 0.9} // where in the renew interval the kill lands

	type result struct {
		ttl, renew, left, took, afterExpiry time.Duration
	}
	var results []result
	for _, ttl := range ttls {
		for i, phase := range phases {
			name := fmt.Sprintf("takeover-%v-%d", ttl, i)
			t.Run(name, func(t *testing.T) {
				renew := ttl / 3 // the Manager's default renew interval
				keys := keysFor(t, rc, prefix, name)
				t.Cleanup(func() { rc.Del(context.Background(), keys.Lease, keys.Token) })
				args := []string{"-redis", testenv.RedisURL(), "-prefix", prefix, "-name", name, "-ttl", ttl.String(), "-timeout", "60s"}

				a := itest.StartHolder(t, append(args, "-do", "hold")...)
				acq := a.NextHeld("acquired", 30*time.Second)
				// Let A renew at least once, then kill it at the chosen
				// point of its renew cycle.
				a.NextHeld("renewed", 10*ttl+10*time.Second)
				b := itest.StartHolder(t, args...)
				b.NextHeld("waiting", 30*time.Second)
				// Give B's first attempt time to be refused, so that it
				// is waiting when A dies.
				time.Sleep(50 * time.Millisecond)
				a.Drain()
				renews := a.Seen("renewed")
				target := renews[len(renews)-1].Sent.Add(time.Duration(phase * float64(renew)))
				for time.Until(target) < 5*time.Millisecond {
					target = target.Add(renew)
				}
				time.Sleep(time.Until(target))
				killed := a.Signal(syscall.SIGKILL)
				left, err := rc.PTTL(context.Background(), keys.Lease).Result()
				if err != nil {
					t.Fatalf("PTTL: %v", err)
				}
				if err := a.Wait(10 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("holder A: want killed by SIGKILL, got exit %v", err)
				}
				got := b.NextHeld("acquired", 10*ttl+10*time.Second)
				if err := b.Wait(30 * time.Second); err != nil {
					t.Fatalf("process B exited with %v: %s", err, b.History())
				}

				// The last renewal A reported bounds the grant from below:
				// the store set its expiry no earlier than send + TTL.
				lastSent := a.LastSent(acq)
				took := got.At.Sub(killed)
				afterExpiry := got.At.Sub(lastSent.Add(ttl))
				t.Logf("TTL %v, renew every %v: A (token %d) killed with %v left in Redis; B acquired (token %d) %v after the kill, %v after A's grant ran out",
					ttl, renew.Round(time.Millisecond), acq.Token, left.Round(time.Millisecond), got.Token, took.Round(time.Millisecond), afterExpiry.Round(time.Millisecond))
				results = append(results, result{ttl, renew, max(left, 0), took, afterExpiry})

				if got.Token <= acq.Token {
					t.Errorf("B's token %d is not greater than A's %d", got.Token, acq.Token)
				}
				if got.At.Before(killed) {
					t.Errorf("B acquired at %v, before A was killed at %v", got.At, killed)
				}
				// Redis keeps expiry times in whole milliseconds.
				if afterExpiry < -2*time.Millisecond {
					t.Errorf("B acquired %v before the grant A last renewed (sent %v) could have expired: exclusivity broken", -afterExpiry, lastSent.Format("15:04:05.000"))
				}
				if bound := ttl + renew + slack; took > bound {
					t.Errorf("takeover took %v, more than TTL %v + renew interval %v + slack %v", took, ttl, renew, slack)
				}
			})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "takeover after SIGKILL (kill -> next acquire):\n  %-6s %-7s %-22s %-10s %s\n", "TTL", "renew", "grant left at the kill", "takeover", "takeover - grant left")
	for _, r := range results {
		fmt.Fprintf(&b, "  %-6v %-7v %-22v %-10v %v\n", r.ttl, r.renew.Round(time.Millisecond), r.left.Round(time.Millisecond), r.took.Round(time.Millisecond), (r.took - r.left).Round(time.Millisecond))
	}
	t.Log(b.String())
}

// keysFor returns the Redis keys redislease uses for name under prefix.
func keysFor(t testing.TB, rc redislease.Client, prefix, name string) redislease.Keys {
	t.Helper()
	b, err := redislease.New(rc, func(o *redislease.Options) { o.Prefix = prefix })
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	return b.KeysFor(name)
}
