package leaseprom_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseprom"
	"github.com/fencekit/fencekit/lease/memlease"
)

// One Observer for the Manager (and for the guards: sqlguard.WithObserver,
// blobguard.WithObserver), registered with a registry that a
// promhttp.Handler would serve.
func Example() {
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		panic(err)
	}
	m, err := lease.NewManager(memlease.New(), 10*time.Second, lease.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	l, err := m.TryAcquire(context.Background(), "nightly-invoices")
	if err != nil {
		panic(err)
	}
	defer l.Release(context.Background())

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "fencekit_lease_held" {
			fmt.Println(mf.GetName(), mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// fencekit_lease_held 1
}
