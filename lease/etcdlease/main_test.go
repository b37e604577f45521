package etcdlease_test

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefix returns a key prefix of its own for one test.
func prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fencekit-test/" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + hex.EncodeToString(b[:]) + "/"
}

// newBackend returns a backend over cli with the test servers' minimum TTL,
// closed when the test ends.
var newBackend = etcdtest.NewBackend

// revokeLeasesUnder revokes, from an operator's client, every etcd lease
// that has a key under prefix attached, and returns how many it revoked.
func revokeLeasesUnder(t testing.TB, admin *clientv3.Client, prefix string) int {
	t.Helper()
	ctx := testkit.Context(t)
	ls, err := admin.Leases(ctx)
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	n := 0
	for _, l := range ls.Leases {
		ttl, err := admin.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatalf("TimeToLive(%x): %v", l.ID, err)
		}
		for _, k := range ttl.Keys {
			if strings.HasPrefix(string(k), prefix) {
				if _, err := admin.Revoke(ctx, l.ID); err != nil {
					t.Fatalf("Revoke(%x): %v", l.ID, err)
				}
				n++
				break
			}
		}
	}
	return n
}

// cluster starts a three-member cluster for one test, with the Steady
// timing (see etcdtest.Steady); tests that measure a failover use
// etcdtest.Start (the Fast timing: TickMs 10, ElectionMs 100).
func cluster(t testing.TB) *etcdtest.Cluster { return etcdtest.StartWith(t, 3, etcdtest.Steady) }

// stepClock is a clock that stands still until the test moves it
// (etcdlease.SetClock).
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func newStepClock() *stepClock { return &stepClock{t: time.Now()} }

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
