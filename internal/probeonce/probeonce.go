// Package probeonce runs a guard's store probe once, on first use, and
// remembers its verdict: the guards (blobguard, dynamoguard) probe that the
// store honours conditional writes before their first call, and refuse
// every call after a probe that found it does not (fail closed).
package probeonce

import (
	"context"
	"sync"
)

// Gate remembers the outcome of a probe. The zero Gate has not probed. It
// is safe for concurrent use.
type Gate struct {
	probeMu sync.Mutex // serialises probes
	mu      sync.Mutex // guards done and refused
	done    bool       // a probe finished with a verdict
	refused error      // the verdict: nil, or why the store is refused
}

// Probe runs probe now (after any probe in progress) and returns its
// error. probe returns whether its error is a verdict to remember (nil, or
// a refusal), and the error; an error that is not (the store could not be
// reached) is returned without being remembered, and the next Ensure
// probes again.
func (g *Gate) Probe(ctx context.Context, probe func(context.Context) (verdict bool, err error)) error {
	g.probeMu.Lock()
	defer g.probeMu.Unlock()
	return g.run(ctx, probe)
}

// Ensure returns the remembered verdict, probing first if there is none.
// It returns ctx.Err() at once if ctx has ended.
func (g *Gate) Ensure(ctx context.Context, probe func(context.Context) (verdict bool, err error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if done, refused := g.verdict(); done {
		return refused
	}
	g.probeMu.Lock()
	defer g.probeMu.Unlock()
	if done, refused := g.verdict(); done {
		return refused
	}
	return g.run(ctx, probe)
}

func (g *Gate) verdict() (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done, g.refused
}

func (g *Gate) run(ctx context.Context, probe func(context.Context) (bool, error)) error {
	verdict, err := probe(ctx)
	if verdict {
		g.mu.Lock()
		g.done, g.refused = true, err
		g.mu.Unlock()
	}
	return err
}
