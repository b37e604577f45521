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
// deadline has come (all of them marked lost before any is reported, in
// deadline order) and sends every heartbeat due within RenewBatchWindow in
// one batch where the backend can batch. No goroutine runs while nothing is
// due.
type scheduler struct {
	e *engine

	mu         sync.Mutex
	deadlines  entryHeap
	heartbeats entryHeap
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
func (s *scheduler) groupLead() time.Duration {
	maxLead := s.e.o.SafetyMargin / 2
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
func (h entryHeap) countUntil(t time.Time, limit int) int {
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

// entry is one scheduled instant of one lease. Each Lease embeds two.
type entry struct {
	l   *Lease
	at  time.Time
	idx int // position in its heap; -1 when not queued
}

type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h entryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *entryHeap) Push(x any)        { e := x.(*entry); e.idx = len(*h); *h = append(*h, e) }
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}

// set (re)schedules e at at, in h.
func (s *scheduler) set(h *entryHeap, e *entry, at time.Time) {
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

func (s *scheduler) setDeadline(e *entry, at time.Time) { s.set(&s.deadlines, e, at) }

// setHeartbeat schedules a heartbeat at at, rounded up to the Manager's
// grid of RenewBatchWindow when heartbeats are batched: heartbeats that fall
// due within one window then share one instant, one wake-up and one batch,
// whatever the phases their acquisitions gave them. Rounding up delays a
// renewal by less than the window, which validation keeps below a quarter
// of RenewInterval.
func (s *scheduler) setHeartbeat(e *entry, at time.Time) {
	if w := s.e.o.RenewBatchWindow; w > 0 && s.e.br != nil {
		if r := s.e.since(at) % w; r != 0 {
			at = at.Add(w - r)
		}
	}
	s.set(&s.heartbeats, e, at)
}

// remove unschedules a lease's two entries.
func (s *scheduler) remove(l *Lease) {
	s.mu.Lock()
	if l.dl.idx >= 0 {
		heap.Remove(&s.deadlines, l.dl.idx)
	}
	if l.hb.idx >= 0 {
		heap.Remove(&s.heartbeats, l.hb.idx)
	}
	s.mu.Unlock()
}

// arm sets the timer for the earliest entry, if it is earlier than the
// timer already set. mu must be held.
func (s *scheduler) arm() {
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
func (s *scheduler) fire() {
	now := time.Now()
	s.mu.Lock()
	s.armed = time.Time{}
	var expired, due []*Lease
	var lead time.Duration
	for {
		s.lead = s.groupLead()
		if len(s.deadlines) == 0 || s.deadlines[0].at.After(now.Add(s.lead)) {
			break
		}
		lead = max(lead, s.lead)
		for len(s.deadlines) > 0 && !s.deadlines[0].at.After(now.Add(lead)) {
			expired = append(expired, heap.Pop(&s.deadlines).(*entry).l)
		}
	}
	// Heartbeats due before the next grid point go out now, together (a
	// renewal sent early is valid from its own send time): the timer may
	// fire late, and those due meanwhile join.
	horizon := now.Add(s.e.o.RenewBatchWindow)
	for len(s.heartbeats) > 0 && !s.heartbeats[0].at.After(horizon) {
		due = append(due, heap.Pop(&s.heartbeats).(*entry).l)
	}
	s.arm()
	s.mu.Unlock()

	if len(expired) > 0 {
		s.expire(expired, now.Add(lead))
	}
	if len(due) == 0 {
		return
	}
	if s.e.br != nil {
		go s.e.renewBatch(due)
		return
	}
	for _, l := range due {
		go s.e.heartbeat(l)
	}
}

// expire ends the leases whose deadline is at or before now (which may be
// a little ahead of the clock: see groupLead), earliest deadline first, spread over up to GOMAXPROCS goroutines when there are many (each
// end costs a lock and a context cancellation; thousands of leases renewed
// in one batch share one deadline). Err does not wait for this: it reads
// the clock itself.
func (s *scheduler) expire(ls []*Lease, now time.Time) {
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
			s.expireOne(l, now)
		}
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ls); i += workers {
				s.expireOne(ls[i], now)
			}
		}()
	}
	wg.Wait()
}

// expirePerWorker is how many expiries one goroutine takes before expire
// spreads them over more.
const expirePerWorker = 256

// expireOne ends l if its deadline has passed at now. Its heartbeat entry,
// if queued, is left to be refused when it comes due.
func (s *scheduler) expireOne(l *Lease, now time.Time) {
	l.mu.Lock()
	eff := l.apply(event{kind: evDeadline, at: now})
	if !eff.ended && l.st.phase.live() {
		// A renewal moved the deadline after the entry was taken.
		s.setDeadline(&l.dl, l.st.deadline)
	}
	l.mu.Unlock()
	l.report(eff)
}
