package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// Logger returns a logger that writes warnings and errors to tb's log, for
// a backend's or a guard's WithLogger option in tests.
func Logger(tb testing.TB) *slog.Logger { return slog.New(logHandler{tb}) }

type logHandler struct{ tb testing.TB }

func (h logHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.tb.Logf("%s %s", r.Time.Format("15:04:05.000"), b.String())
	return nil
}

func (h logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logHandler) WithGroup(string) slog.Handler      { return h }
