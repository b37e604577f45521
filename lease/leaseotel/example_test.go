package leaseotel_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseotel"
	"github.com/fencekit/fencekit/lease/memlease"
)

// The Observer goes to the Manager (lease events) and to the guards
// (sqlguard.WithObserver, blobguard.WithObserver: guarded writes). Here the
// spans go to an in-process exporter; a service passes its own providers.
func Example() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	mp := sdkmetric.NewMeterProvider()
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())

	obs, err := leaseotel.New(tp, mp)
	if err != nil {
		panic(err)
	}
	// With Prometheus metrics as well: lease.Observers{obs, promObserver}.
	m, err := lease.NewManager(memlease.New(), 10*time.Second, lease.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	l, err := m.TryAcquire(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	_ = l.Release(ctx)

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, s.Attributes[0].Value.String())
	}
	// Output:
	// fencekit.lease.acquire nightly-report
	// fencekit.lease.release nightly-report
}
