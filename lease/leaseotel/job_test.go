package leaseotel_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseotel"
	"github.com/fencekit/fencekit/lease/memlease"
)

// fencekit.job.running{lease} is 1 while Run, RunOnce or an election's
// term runs its job under the lease, and 0 once the job's lease ended, as
// leaseprom's gauge is.
func TestJobInstrumentFollowsRunRunOnceAndElections(t *testing.T) {
	s := newSetup(t)
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckJobGauge(t, m, "fencekit.job.running", func(name string) int64 {
		return sumValue(t, s.reader, "fencekit.job.running", map[string]string{"lease": name})
	})
}

// The instrument has an attribute value for each of the first
// MaxJobLeases lease names, and counts the jobs of every later name under
// lease="".
func TestJobInstrumentCardinalityIsBounded(t *testing.T) {
	s := newSetup(t)
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	var during []int64
	for i := range leaseotel.MaxJobLeases + 3 {
		err := m.TryRun(t.Context(), "order-"+strconv.Itoa(i), func(context.Context, *lease.Lease) error {
			if i >= leaseotel.MaxJobLeases {
				during = append(during, sumValue(t, s.reader, "fencekit.job.running", map[string]string{"lease": ""}))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sum, ok := collect(t, s.reader, "fencekit.job.running").(metricdata.Sum[int64])
	if !ok {
		t.Fatal("fencekit.job.running is not an int64 sum")
	}
	if n := len(sum.DataPoints); n != leaseotel.MaxJobLeases+1 {
		t.Fatalf("fencekit.job.running has %d attribute sets, want %d (one per name up to the bound, and lease=\"\")", n, leaseotel.MaxJobLeases+1)
	}
	if len(during) != 3 || during[0] != 1 || during[1] != 1 || during[2] != 1 {
		t.Fatalf("lease=\"\" while a job beyond the bound ran: %v, want 1 each time", during)
	}
}
