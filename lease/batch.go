package lease

import (
	"context"
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
	sent := time.Now()
	errs := m.br.RenewBatch(ctx, gs)
	cancel()
	latency := time.Since(sent)
	var giveBack []*Lease
	for i, l := range live {
		err := errShortBatch
		if i < len(errs) {
			err = errs[i]
		}
		err, gb := l.endRenew(sent, latency, err)
		l.scheduleHeartbeat(sent, err)
		if gb {
			giveBack = append(giveBack, l)
		}
	}
	// Only after every lease of the batch has its result: a give-back can
	// take up to ReleaseTimeout.
	for _, l := range giveBack {
		m.releaseQuietly(context.Background(), l.g)
	}
}
