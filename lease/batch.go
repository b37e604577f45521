package lease

import (
	"context"
	"sync"
	"time"
)

// BatchRenewer is implemented by backends that can renew many leases in one
// round trip (Redis: a pipeline of renew scripts). When the backend
// implements it, the heartbeats of one Manager's leases that fall due within
// Options.RenewBatchWindow of each other are sent together.
type BatchRenewer interface {
	// RenewBatch renews every record as Renew would and returns one error
	// per record, in order: nil, ErrNotHeld, or the store's error. ctx
	// bounds the whole batch.
	RenewBatch(ctx context.Context, recs []Record) []error
}

// batcher coalesces heartbeat renewals into RenewBatch calls.
type batcher struct {
	m      *Manager
	br     BatchRenewer
	window time.Duration

	mu      sync.Mutex
	pending []batchItem
	armed   bool
}

type batchItem struct {
	l    *Lease
	done chan error
}

// renew queues l's renewal, waits for the batch it joined, and returns the
// result as Lease.Renew would.
func (b *batcher) renew(l *Lease) error {
	if _, err := l.renewable(); err != nil {
		return err
	}
	it := batchItem{l: l, done: make(chan error, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, it)
	if !b.armed {
		b.armed = true
		time.AfterFunc(b.window, b.flush)
	}
	b.mu.Unlock()
	return <-it.done
}

func (b *batcher) flush() {
	b.mu.Lock()
	items := b.pending
	b.pending, b.armed = nil, false
	b.mu.Unlock()

	live := items[:0]
	recs := make([]Record, 0, len(items))
	var latest time.Time
	for _, it := range items {
		deadline, err := it.l.renewable()
		if err != nil {
			it.done <- err
			continue
		}
		live = append(live, it)
		recs = append(recs, it.l.rec)
		if deadline.After(latest) {
			latest = deadline
		}
	}
	if len(live) == 0 {
		return
	}
	// Bounded by the latest local deadline in the batch: a lease whose own
	// deadline passes first is lost by its timer meanwhile, whatever the
	// reply says.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()
	sent := time.Now()
	errs := b.br.RenewBatch(ctx, recs)
	latency := time.Since(sent)
	var giveBack []*Lease
	for i, it := range live {
		err := errShortBatch
		if i < len(errs) {
			err = errs[i]
		}
		res, gb := it.l.renewed(sent, latency, err)
		it.done <- res
		if gb {
			giveBack = append(giveBack, it.l)
		}
	}
	// Only after every lease of the batch has its result: a give-back can
	// take up to ReleaseTimeout.
	for _, l := range giveBack {
		b.m.releaseQuietly(context.Background(), l.rec)
	}
}

// renewDelay returns how long to wait until a heartbeat due at due. With
// batching on, due times are rounded up to the Manager's grid of
// RenewBatchWindow, so that heartbeats due within one window fire together:
// one wake-up of the process and one round trip for all of them, instead of
// one wake-up per lease. Rounding up delays a renewal by less than the
// window, which validation keeps below a quarter of RenewInterval.
func (m *Manager) renewDelay(due time.Time) time.Duration {
	if m.batcher != nil {
		w := m.batcher.window
		since := due.Sub(m.epoch)
		if r := since % w; r != 0 {
			due = due.Add(w - r)
		}
	}
	return max(time.Until(due), 0)
}
