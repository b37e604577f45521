// Package zkleasetest connects zklease backends for tests, to the servers
// that internal/testkit/zktest starts.
//
// It is fencekit's own test equipment, a package of this module so that
// the tests of several modules share it without a test-kit module in any
// user's graph (docs/versioning.md). It is not part of the library: its API
// may change in any release, and no library package imports it.
package zkleasetest

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/zklease"
)

// ReadyTimeout bounds NewBackend's wait for the backend's first session.
const ReadyTimeout = 30 * time.Second

// NewBackend connects a Backend to servers, logging its warnings to tb's
// log, and closes it when tb ends. opts come after the logger and may
// change it. It returns once the first session is set up (it is set up in
// the background), so that TTL-sensitive checks do not count it; it fails
// tb if there is none within ReadyTimeout.
func NewBackend(tb testing.TB, servers []string, opts ...zklease.Option) *zklease.Backend {
	tb.Helper()
	b, err := zklease.New(servers, append([]zklease.Option{zklease.WithLogger(testkit.Logger(tb))}, opts...)...)
	if err != nil {
		tb.Fatalf("zklease.New: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	if err := b.Ready(ctx); err != nil {
		tb.Fatalf("zklease: no session: %v", err)
	}
	return b
}
