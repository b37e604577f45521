package probeonce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestGate(t *testing.T) {
	ctx := context.Background()
	var g Gate
	var runs atomic.Int32
	unreachable := errors.New("unreachable")
	refused := errors.New("refused")
	outcome := unreachable
	probe := func(context.Context) (bool, error) {
		runs.Add(1)
		return outcome != unreachable, outcome
	}
	if err := g.Ensure(ctx, probe); err != unreachable {
		t.Fatalf("Ensure = %v, want the probe's error", err)
	}
	outcome = refused
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := g.Ensure(ctx, probe); err != refused {
				t.Errorf("Ensure = %v, want the refusal", err)
			}
		})
	}
	wg.Wait()
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d probes, want 2 (an unreachable store is probed again; a verdict is kept)", n)
	}
	outcome = nil
	if err := g.Probe(ctx, probe); err != nil || g.Ensure(ctx, probe) != nil || runs.Load() != 3 {
		t.Fatalf("a later Probe's verdict was not kept: %v, %d runs", err, runs.Load())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Ensure(cctx, probe); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure with an ended context = %v", err)
	}
}
