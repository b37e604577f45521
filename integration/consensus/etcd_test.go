package consensus

import (
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/etcdtest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// The etcd tests' helpers, as lease/etcdlease's tests have them.

// etcdPrefix returns a key prefix of its own for one test.
func etcdPrefix(t testing.TB) string {
	return "fencekit-test/" + testName(t) + "-" + randHex(6) + "/"
}

// newEtcdBackend returns a backend over cli with the test servers' minimum
// TTL (1 s: TickMs 10, ElectionMs 100), closed when the test ends.
func newEtcdBackend(t testing.TB, cli etcdlease.Client, prefix string) *etcdlease.Backend {
	t.Helper()
	b, err := etcdlease.New(cli, etcdlease.WithPrefix(prefix), etcdlease.WithMinTTL(time.Second))
	if err != nil {
		t.Fatalf("etcdlease.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// etcdCluster starts a three-member cluster for one test, with the Steady
// timing (see etcdtest.Steady).
func etcdCluster(t testing.TB) *etcdtest.Cluster { return etcdtest.StartWith(t, 3, etcdtest.Steady) }

// renewLog records the send time of the last request the store confirmed
// for each lease token: the acquire (set by the test) or a renewal.
type renewLog struct {
	lease.NopObserver
	mu   sync.Mutex
	sent map[fence.Token]time.Time
}

func newRenewLog() *renewLog { return &renewLog{sent: map[fence.Token]time.Time{}} }

func (r *renewLog) Renewed(e lease.RenewedEvent) {
	if e.Err == nil {
		r.confirmed(e.Token, e.Sent)
	}
}

func (r *renewLog) confirmed(tok fence.Token, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sent.After(r.sent[tok]) {
		r.sent[tok] = sent
	}
}

func (r *renewLog) last(tok fence.Token) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[tok]
}

// acquiredSent is the send time of the request that granted l: its first
// deadline is that plus TTL - safety margin.
func acquiredSent(m *lease.Manager, l *lease.Lease) time.Time {
	return l.Deadline().Add(-(l.TTL() - m.Options().SafetyMargin))
}
