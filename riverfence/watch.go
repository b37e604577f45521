package riverfence

import (
	"context"
	"sync"
	"time"
)

// outcome is what is known of a running attempt's end: superseded (and
// by what), or completed by Complete. The watch, Complete and the
// middleware share it.
type outcome struct {
	mu   sync.Mutex
	sup  *SupersededError
	done bool
}

// supersede records sup, unless the attempt has completed or was found
// superseded already; it reports whether sup was recorded.
func (o *outcome) supersede(sup *SupersededError) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done || o.sup != nil {
		return false
	}
	o.sup = sup
	return true
}

// complete records that the attempt completed the job: its completion
// committed, so it was the job's current attempt, whatever a watch that
// raced with the commit recorded.
func (o *outcome) complete() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = true
}

func (o *outcome) superseded() *SupersededError {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sup
}

func (o *outcome) completed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// watch reads the job's row every WatchInterval while the attempt runs,
// and ends the attempt's context with a *SupersededError as its cause when
// the row shows the attempt superseded. A read that fails is tried again
// at the next tick: the work's own writes meet the same database and
// report its errors. The returned function stops the watch and waits for
// its goroutine, aborting a read in flight.
func (f *Fence) watch(ctx context.Context, r *running, cancel context.CancelCauseFunc) (stop func()) {
	ctx, abort := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(f.opts.WatchInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if r.st.completed() {
				return
			}
			row, err := f.read(ctx, &r.a)
			if err != nil {
				continue
			}
			if sup := row.supersedes(&r.a); sup != nil && r.st.supersede(sup) {
				cancel(sup)
				return
			}
		}
	}()
	return func() {
		abort()
		<-exited
	}
}
