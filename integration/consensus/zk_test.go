package consensus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease/zklease"
)

// The ZooKeeper tests' helpers, as lease/zklease's tests have them.

// newZKBackend connects a Backend to servers, closed when the test ends.
func newZKBackend(t testing.TB, servers []string, opts ...zklease.Option) *zklease.Backend {
	t.Helper()
	b, err := zklease.New(servers, append([]zklease.Option{zklease.WithLogger(slog.New(testLogHandler{t}))}, opts...)...)
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

// testLogHandler sends the backend's warnings to the test's log.
type testLogHandler struct{ t testing.TB }

func (h testLogHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h testLogHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.t.Logf("%s %s", r.Time.Format("15:04:05.000"), b.String())
	return nil
}
func (h testLogHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h testLogHandler) WithGroup(string) slog.Handler      { return h }
