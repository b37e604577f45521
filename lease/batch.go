package lease

import (
	"context"
	"sync"
	"time"
)

// renewBatch sends the heartbeats of ls in one BatchRenewer call and
// schedules each lease's next heartbeat. Leases that ended, or are being
// released, are left out (the gate in beginRenew).
func (m *Manager) renewBatch(ls []*Lease) {
	live := ls[:0]
	gs := make([]Grant, 0, len(ls))
	var latest time.Time
	for _, l := range ls {
		deadline, _, err := l.beginRenew()
		if err != nil {
			continue
		}
		live = append(live, l)
		gs = append(gs, l.g)
		if deadline.After(latest) {
			latest = deadline
		}
	}
	if len(live) == 0 {
		return
	}
	// Bounded by the latest local deadline in the batch: a lease whose own
	// deadline passes first is lost by the scheduler meanwhile, whatever
	// the reply says.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()
	sent := time.Now()
	var (
		mu       sync.Mutex
		answered = make([]bool, len(live))
		giveBack []*Lease
	)
	end := func(i int, err error) {
		mu.Lock()
		if i < 0 || i >= len(live) || answered[i] {
			mu.Unlock()
			return // a backend that broke the contract; the rest is errShortBatch
		}
		answered[i] = true
		mu.Unlock()
		l := live[i]
		err, gb := l.endRenew(sent, time.Since(sent), err)
		l.scheduleHeartbeat(sent, err)
		if gb {
			mu.Lock()
			giveBack = append(giveBack, l)
			mu.Unlock()
		}
	}
	m.br.RenewBatch(ctx, gs, end)
	for i := range live {
		mu.Lock()
		missing := !answered[i]
		mu.Unlock()
		if missing {
			end(i, errShortBatch)
		}
	}
	// Only after every lease of the batch has its result: a give-back can
	// take up to ReleaseTimeout.
	for _, l := range giveBack {
		m.releaseQuietly(context.Background(), l.g)
	}
}
