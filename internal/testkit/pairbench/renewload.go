package pairbench

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
)

// RenewTTL is the renew load benchmarks' TTL: client-go's leader election
// default LeaseDuration, whose holder renews every RetryPeriod (2 s).
const RenewTTL = 15 * time.Second

// RenewCounter is a lease.Observer that counts the renewals a Manager
// reports.
type RenewCounter struct {
	lease.NopObserver
	n atomic.Int64
}

// Renewed implements lease.Observer.
func (c *RenewCounter) Renewed(lease.RenewedEvent) { c.n.Add(1) }

// Load returns the renewals counted so far.
func (c *RenewCounter) Load() int64 { return c.n.Load() }

// RenewLoad is the body of a renew load benchmark: it acquires leases
// names (prefix followed by a number) through m, spread over one renew
// interval as leases taken at random times over a long run would be, then
// holds them for a window of b.N seconds (run it with -benchtime 10x: two
// renew intervals and more at RenewTTL) and fails if any was lost. The
// Manager must report its renewals to renewals; requests returns the
// requests counted so far, by kind.
//
// Metrics, per 1,000 held leases: reqs/s, the requests of every kind the
// store received per second over the window; renewals/s, the renewals
// those requests carried; and <kind>/s for each kind requests names (all
// but the kind "", which only counts).
func RenewLoad(b *testing.B, m *lease.Manager, renewals *RenewCounter, prefix string, leases int, requests func() map[string]int64) {
	b.Helper()
	ctx := context.Background()
	held := make([]*lease.Lease, 0, leases)
	defer func() {
		for _, l := range held {
			_ = l.Release(ctx)
		}
	}()
	interval := m.Options().RenewInterval
	for i := range leases {
		l, err := m.TryAcquire(ctx, fmt.Sprintf("%s%d", prefix, i))
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, l)
		time.Sleep(interval / time.Duration(leases))
	}
	r0, n0 := requests(), renewals.Load()
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * time.Second)
	b.StopTimer()
	r1, n1 := requests(), renewals.Load()
	for _, l := range held {
		if err := l.Err(); err != nil {
			b.Fatalf("a lease was lost while renewed: %v", err)
		}
	}
	per := 1000 / float64(leases) / float64(b.N) // per 1,000 leases, per second
	kinds := make([]string, 0, len(r1))
	var all int64
	for k, v := range r1 {
		kinds = append(kinds, k)
		all += v - r0[k]
	}
	sort.Strings(kinds)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(all)*per, "reqs/s")
	b.ReportMetric(float64(n1-n0)*per, "renewals/s")
	for _, k := range kinds {
		if k != "" {
			b.ReportMetric(float64(r1[k]-r0[k])*per, k+"/s")
		}
	}
}
