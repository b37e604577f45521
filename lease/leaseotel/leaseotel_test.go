package leaseotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseotel"
	"github.com/fencekit/fencekit/lease/memlease"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type setup struct {
	obs    *leaseotel.Observer
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

func newSetup(t *testing.T) *setup {
	s := &setup{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	t.Cleanup(func() { _ = s.tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	obs, err := leaseotel.New(s.tp, mp)
	if err != nil {
		t.Fatal(err)
	}
	s.obs = obs
	return s
}

func attrs(kv []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, a := range kv {
		m[a.Key] = a.Value.String()
	}
	return m
}

// A lease's acquire, renew and release, and a guarded write, exported to
// an in-process exporter: each is a span under the caller's span, with the
// lease name and the token as attributes, timed from the event.
func TestSpansAndAttributes(t *testing.T) {
	s := newSetup(t)
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithoutAutoRenew(), lease.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, parent := s.tp.Tracer("test").Start(context.Background(), "job")
	l, err := m.TryAcquire(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-3 * time.Millisecond)
	_ = fence.ObserveWrite(s.obs, fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: "public.invoices", Op: "update",
		Resource: "public.invoices(id=7)", Token: l.Token(), Start: start}, nil)
	_ = fence.ObserveWrite(s.obs, fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: "public.invoices", Op: "update",
		Resource: "public.invoices(id=7)", Token: l.Token() - 1, Start: time.Now()}, fence.Stale("public.invoices(id=7)", l.Token()-1, l.Token()))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	want := []struct {
		name   string
		status codes.Code
		attrs  map[attribute.Key]string
	}{
		{"fencekit.lease.acquire", codes.Unset, map[attribute.Key]string{leaseotel.KeyLeaseName: "nightly", leaseotel.KeyToken: l.Token().String(), leaseotel.KeyAttempts: "1"}},
		{"fencekit.lease.renew", codes.Unset, map[attribute.Key]string{leaseotel.KeyLeaseName: "nightly", leaseotel.KeyToken: l.Token().String()}},
		{"fencekit.guard.write", codes.Unset, map[attribute.Key]string{leaseotel.KeyGuard: "sqlguard", leaseotel.KeyClass: "public.invoices", leaseotel.KeyOp: "update",
			leaseotel.KeyResource: "public.invoices(id=7)", leaseotel.KeyToken: l.Token().String(), leaseotel.KeyOutcome: "accepted"}},
		{"fencekit.guard.write", codes.Error, map[attribute.Key]string{leaseotel.KeyToken: (l.Token() - 1).String(), leaseotel.KeyOutcome: "stale"}},
		{"fencekit.lease.release", codes.Unset, map[attribute.Key]string{leaseotel.KeyLeaseName: "nightly", leaseotel.KeyToken: l.Token().String()}},
		{"job", codes.Unset, nil},
	}
	got := s.spans.GetSpans()
	if len(got) != len(want) {
		t.Fatalf("%d spans, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		sp := got[i]
		if sp.Name != w.name || sp.Status.Code != w.status {
			t.Fatalf("span %d: %q status %v, want %q status %v", i, sp.Name, sp.Status.Code, w.name, w.status)
		}
		a := attrs(sp.Attributes)
		for k, v := range w.attrs {
			if a[k] != v {
				t.Fatalf("span %s: attribute %s = %q, want %q (all: %v)", sp.Name, k, a[k], v, a)
			}
		}
		if w.name != "job" && (sp.Parent.SpanID() != parent.SpanContext().SpanID() || sp.SpanContext.TraceID() != parent.SpanContext().TraceID()) {
			t.Fatalf("span %s is not a child of the caller's span", sp.Name)
		}
		if sp.EndTime.Before(sp.StartTime) {
			t.Fatalf("span %s ends before it starts", sp.Name)
		}
	}
	// The accepted write's span is timed from the event's start.
	if d := got[2].EndTime.Sub(got[2].StartTime); d < 3*time.Millisecond || !got[2].StartTime.Equal(start) {
		t.Fatalf("write span %v from %v, want from the event's start %v, at least 3ms", d, got[2].StartTime, start)
	}
}

// The metrics mirror leaseprom's: leases held, leadership, guard outcomes.
func TestMetrics(t *testing.T) {
	s := newSetup(t)
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := lease.NewElection(m, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var leading, held int64
	_ = e.Run(runCtx, func(ctx context.Context, l *lease.Lease) error {
		leading = gaugeValue(t, s.reader, "fencekit.election.leader")
		held = sumValue(t, s.reader, "fencekit.lease.held", nil)
		cancel()
		return nil
	})
	if leading != 1 || held != 1 {
		t.Fatalf("while leading: leader gauge %d, held %d; want 1, 1", leading, held)
	}
	if g := gaugeValue(t, s.reader, "fencekit.election.leader"); g != 0 {
		t.Fatalf("after the term: leader gauge %d, want 0", g)
	}
	for _, err := range []error{nil, fence.Stale("r", 1, 2), errors.Join(fence.ErrOutcomeUnknown), errors.New("refused")} {
		_ = fence.ObserveWrite(s.obs, fence.WriteEvent{Ctx: ctx, Guard: "blobguard", Class: "bucket", Op: "put", Token: 1, Start: time.Now()}, err)
	}
	for _, outcome := range []string{"accepted", "stale", "unknown", "failed"} {
		if n := sumValue(t, s.reader, "fencekit.guard.writes", map[string]string{"outcome": outcome, "guard": "blobguard", "class": "bucket"}); n != 1 {
			t.Fatalf("guard writes %s = %d, want 1", outcome, n)
		}
	}
	if n := sumValue(t, s.reader, "fencekit.lease.held", nil); n != 0 {
		t.Fatalf("held after every lease ended = %d, want 0", n)
	}
}

func collect(t *testing.T, r *sdkmetric.ManualReader, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		if got, ok := set.Value(attribute.Key(k)); !ok || got.String() != v {
			return false
		}
	}
	return true
}

func sumValue(t *testing.T, r *sdkmetric.ManualReader, name string, want map[string]string) int64 {
	t.Helper()
	sum, ok := collect(t, r, name).(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is not an int64 sum", name)
	}
	var n int64
	for _, dp := range sum.DataPoints {
		if matches(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

func gaugeValue(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	g, ok := collect(t, r, name).(metricdata.Gauge[int64])
	if !ok || len(g.DataPoints) != 1 {
		t.Fatalf("%s: %+v, want one int64 gauge point", name, g)
	}
	return g.DataPoints[0].Value
}

func TestNilProviders(t *testing.T) {
	if _, err := leaseotel.New(nil, nil); !errors.Is(err, leaseotel.ErrNilProvider) {
		t.Fatalf("New(nil, nil) = %v, want ErrNilProvider", err)
	}
}
