package bench

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// nopBackend grants every acquire at once, without I/O.
type nopBackend struct{ tok fence.Token }

func (b *nopBackend) Limits() driver.Limits { return driver.Limits{} }
func (b *nopBackend) Acquire(_ context.Context, req driver.Request) (driver.Grant, error) {
	b.tok++
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: b.tok, TTL: req.TTL}, nil
}
func (*nopBackend) Renew(context.Context, driver.Grant) error     { return nil }
func (*nopBackend) Release(context.Context, driver.Grant) error   { return nil }
func (*nopBackend) Abandon(context.Context, driver.Request) error { return nil }

// BenchmarkManagerOverhead is the Go-side cost of a fencekit cycle
// (TryAcquire + Release with default options) over a backend that answers
// at once without I/O: what lib=fencekit adds to lib=fencekit-lua in
// BenchmarkCycle, measured without the network's noise.
func BenchmarkManagerOverhead(b *testing.B) {
	m, err := lease.NewManager(&nopBackend{}, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.TryAcquire(ctx, "overhead")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
