package consensus

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/zklease"
)

// The ZooKeeper tests' helpers, as lease/zklease's tests have them.

// newZKBackend connects a Backend to servers, closed when the test ends.
func newZKBackend(t testing.TB, servers []string, opts ...zklease.Option) *zklease.Backend {
	t.Helper()
	b, err := zklease.New(servers, append([]zklease.Option{zklease.WithLogger(testkit.Logger(t))}, opts...)...)
	if err != nil {
		t.Fatalf("zklease.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// The first session is set up in the background; TTL-sensitive checks
	// should not count it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("zklease: no session: %v", err)
	}
	return b
}
