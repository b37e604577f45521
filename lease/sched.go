package lease

import (
	"container/heap"
	"runtime"
	"sync"
	"time"
)

// scheduler is a Manager's one clock: a heap of every lease's local deadline
// and one of every due heartbeat, served by a single timer. However many
// leases a Manager holds, a tick costs one wake-up: it ends every lease whose
// deadline has come (all of them taken off the heap before any is ended, in
// deadline order) and hands over every heartbeat due within
// RenewBatchWindow at once, so that they can share a request where the
// backend can batch. No goroutine runs while nothing is due. It knows the
// leases only as the values T of their entries, and acts on them only
// through expire and renew.
type scheduler[T any] struct {
	maxLead time.Duration      // the most a group of deadlines is served early: half the safety margin
	window  time.Duration      // RenewBatchWindow: heartbeats due this soon go out with the tick
	grid    time.Duration      // the grid heartbeats are rounded up to: RenewBatchWindow when they are batched, else 0
	epoch   time.Time          // origin of the grid
	expire  func(T, time.Time) // ends one lease whose deadline has come (at the time given, or before)
	renew   func([]T)          // sends the heartbeats that came due; it must not block

	mu         sync.Mutex
	deadlines  entryHeap[T]
	heartbeats entryHeap[T]
	timer      *time.Timer
	armed      time.Time     // when timer fires; zero while it is not set
	lead       time.Duration // how early the next group of deadlines is served (see groupLead)
	cost       time.Duration // what ending one lease costs here, averaged
}

// Ending a lease costs a lock and a context cancellation: a few
// microseconds, tens under the race detector. Thousands of leases renewed in
// one batch share one deadline, and ending them one after the other would
// take the last ones past their deadline, into the safety margin and beyond.
// So when a group of deadlines is that large, the scheduler starts on it
// early, by about what the group will take, so that the last lease of the
// group ends near its deadline. A lead under a millisecond is not taken: a
// small group (a single lease, a few dozen) is served at its deadline
// exactly, never before. The lead never exceeds half the safety margin: at
// worst a lease of a large group is lost that much before its deadline, and
// not after last send + TTL because of this process's own work.
const (
	minGroupLead = time.Millisecond
	initialCost  = 2 * time.Microsecond
	maxCounted   = 1 << 15 // deadlines visited when sizing a group
)

// groupLead returns how early to serve the group of deadlines at the top of
// the heap; mu must be held.
func (s *scheduler[T]) groupLead() time.Duration {
	maxLead := s.maxLead
	if len(s.deadlines) == 0 || maxLead < minGroupLead {
		return 0
	}
	n := s.deadlines.countUntil(s.deadlines[0].at.Add(maxLead), maxCounted)
	cost := s.cost
	if cost == 0 {
		cost = initialCost
	}
	lead := time.Duration(n) * cost * 3 / 2
	if lead < minGroupLead {
		return 0
	}
	return min(lead, maxLead)
}

// countUntil counts the entries at or before t, visiting at most limit.
func (h entryHeap[T]) countUntil(t time.Time, limit int) int {
	n := 0
	stack := []int{0}
	for len(stack) > 0 && n < limit {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(h) || h[i].at.After(t) {
			continue // and so is every entry below it
		}
		n++
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return n
}

// entry is one scheduled instant of one lease, v. Each lease has two: its
// deadline and its next heartbeat.
type entry[T any] struct {
	v   T
	at  time.Time
	idx int // position in its heap; -1 when not queued
}

func newEntry[T any](v T) entry[T] { return entry[T]{v: v, idx: -1} }

type entryHeap[T any] []*entry[T]

func (h entryHeap[T]) Len() int           { return len(h) }
func (h entryHeap[T]) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h entryHeap[T]) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *entryHeap[T]) Push(x any)        { e := x.(*entry[T]); e.idx = len(*h); *h = append(*h, e) }
func (h *entryHeap[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}

// set (re)schedules e at at, in h.
func (s *scheduler[T]) set(h *entryHeap[T], e *entry[T], at time.Time) {
	s.mu.Lock()
	e.at = at
	if e.idx < 0 {
		heap.Push(h, e)
	} else {
		heap.Fix(h, e.idx)
	}
	s.arm()
	s.mu.Unlock()
}

func (s *scheduler[T]) setDeadline(e *entry[T], at time.Time) { s.set(&s.deadlines, e, at) }

// setHeartbeat schedules a heartbeat at at, rounded up to the Manager's
// grid of RenewBatchWindow when heartbeats are batched: heartbeats that fall
// due within one window then share one instant, one wake-up and one batch,
// whatever the phases their acquisitions gave them. Rounding up delays a
// renewal by less than the window, which validation keeps below a quarter
// of RenewInterval.
func (s *scheduler[T]) setHeartbeat(e *entry[T], at time.Time) {
	if w := s.grid; w > 0 {
		if r := at.Sub(s.epoch) % w; r != 0 {
			at = at.Add(w - r)
		}
	}
	s.set(&s.heartbeats, e, at)
}

// remove unschedules a lease's two entries.
func (s *scheduler[T]) remove(dl, hb *entry[T]) {
	s.mu.Lock()
	if dl.idx >= 0 {
		heap.Remove(&s.deadlines, dl.idx)
	}
	if hb.idx >= 0 {
		heap.Remove(&s.heartbeats, hb.idx)
	}
	s.mu.Unlock()
}

// arm sets the timer for the earliest entry, if it is earlier than the
// timer already set. mu must be held.
func (s *scheduler[T]) arm() {
	var next time.Time
	if len(s.deadlines) > 0 {
		next = s.deadlines[0].at.Add(-s.lead)
	}
	if len(s.heartbeats) > 0 && (next.IsZero() || s.heartbeats[0].at.Before(next)) {
		next = s.heartbeats[0].at
	}
	if next.IsZero() || (!s.armed.IsZero() && !next.Before(s.armed)) {
		return
	}
	s.armed = next
	d := time.Until(next)
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
	} else {
		s.timer.Reset(d)
	}
}

// fire serves one tick.
func (s *scheduler[T]) fire() {
	now := time.Now()
	s.mu.Lock()
	s.armed = time.Time{}
	var expired, due []T
	var lead time.Duration
	for {
		s.lead = s.groupLead()
		if len(s.deadlines) == 0 || s.deadlines[0].at.After(now.Add(s.lead)) {
			break
		}
		lead = max(lead, s.lead)
		for len(s.deadlines) > 0 && !s.deadlines[0].at.After(now.Add(lead)) {
			expired = append(expired, heap.Pop(&s.deadlines).(*entry[T]).v)
		}
	}
	// Heartbeats due before the next grid point go out now, together (a
	// renewal sent early is valid from its own send time): the timer may
	// fire late, and those due meanwhile join.
	horizon := now.Add(s.window)
	for len(s.heartbeats) > 0 && !s.heartbeats[0].at.After(horizon) {
		due = append(due, heap.Pop(&s.heartbeats).(*entry[T]).v)
	}
	s.arm()
	s.mu.Unlock()

	if len(expired) > 0 {
		s.expireAll(expired, now.Add(lead))
	}
	if len(due) > 0 {
		s.renew(due)
	}
}

// expireAll ends the leases whose deadline is at or before now (which may
// be a little ahead of the clock: see groupLead), earliest deadline first,
// spread over up to GOMAXPROCS goroutines when there are many (each end
// costs a lock and a context cancellation; thousands of leases renewed in
// one batch share one deadline). Err does not wait for this: it reads the
// clock itself. A lease's heartbeat entry, if queued, is left to be
// refused when it comes due.
func (s *scheduler[T]) expireAll(ls []T, now time.Time) {
	start := time.Now()
	defer func() {
		if len(ls) >= 16 {
			per := time.Since(start) / time.Duration(len(ls))
			s.mu.Lock()
			if s.cost == 0 {
				s.cost = per
			} else {
				s.cost += (per - s.cost) / 4
			}
			s.mu.Unlock()
		}
	}()
	workers := min(runtime.GOMAXPROCS(0), (len(ls)+expirePerWorker-1)/expirePerWorker)
	if workers <= 1 {
		for _, l := range ls {
			s.expire(l, now)
		}
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ls); i += workers {
				s.expire(ls[i], now)
			}
		}()
	}
	wg.Wait()
}

// expirePerWorker is how many expiries one goroutine takes before
// expireAll spreads them over more.
const expirePerWorker = 256
