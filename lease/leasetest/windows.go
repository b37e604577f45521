package leasetest

import (
	"fmt"
	"sort"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Window is one grant of a lease name as its holder saw it, on one clock
// that every holder of the history shares (offsets from a common start:
// one process's monotonic clock, or the wall clock of one machine that was
// not stepped while the holders ran):
//
//   - Start is when the holder's Acquire returned. The store granted the
//     name at or before that moment.
//   - End is the start of the holder's last reading of its lease that
//     found it valid (Lease.Err returned nil), readings taken while its
//     Release ran included. The lease was valid, from the holder's own
//     view, at some moment at or after End.
//   - Deadline, when it is not zero, is the holder's local deadline as it
//     stood at that last reading: the send time of the last request the
//     store confirmed, plus the TTL, minus the safety margin
//     (Lease.Deadline).
//
// Both ends are taken on the inside of the holder's real validity, so a
// window is never longer than the time the holder held the lease: two
// windows of a name that overlap prove that two holders held it at once
// (docs/design.md, invariant 1), whatever the scheduling and the network
// did. The check catches only the overlaps it can see, and never flags a
// correct implementation. A grant that was never read valid after Acquire
// returned has no window (give it an End before its Start).
type Window struct {
	Name   string
	Holder string
	Token  fence.Token
	Start  time.Duration
	End    time.Duration
	// Deadline is zero when the holder did not say.
	Deadline time.Duration
}

func (w Window) String() string {
	return fmt.Sprintf("%s holder %s token %d [%v, %v]", w.Name, w.Holder, w.Token, w.Start, w.End)
}

// Overlap is two windows of one name that overlap: Second started (its
// Acquire returned) before First's holder last read its lease valid.
type Overlap struct {
	First, Second Window
	// By is how long the two windows overlap.
	By time.Duration
}

// Inversion is two windows of one name, in window order, whose tokens do
// not grow: Later started after Earlier but has a token no greater.
type Inversion struct {
	Earlier, Later Window
}

// WindowCheck is what CheckWindows found.
type WindowCheck struct {
	// Windows counts the windows checked (grants read valid at least
	// once).
	Windows    int
	Overlaps   []Overlap
	Inversions []Inversion
	// PastDeadline lists the windows whose holder read its lease valid at
	// or after its own local deadline (Window.Deadline): it acted as the
	// holder when, by the send-time rule (docs/design.md, invariant 3), it
	// had to treat the lease as lost.
	PastDeadline []Window
}

// OK reports whether the check found nothing wrong.
func (c WindowCheck) OK() bool {
	return len(c.Overlaps) == 0 && len(c.Inversions) == 0 && len(c.PastDeadline) == 0
}

// CheckWindows checks the windows of a history of grants: no two windows
// of the same name may overlap (docs/design.md, invariant 1), tokens must
// grow strictly in window order (windows ordered by Start; invariant 2),
// and no holder may read its lease valid at or after the local deadline it
// reported (invariant 3). Windows with End before Start are not windows
// (the holder never read its lease valid) and are ignored. It is a pure
// function: the order of ws does not matter and ws is not changed.
//
// Every overlapping pair is reported once. Token order is checked between
// neighbours in window order, so one window out of place is reported once
// or twice, not once per later window.
func CheckWindows(ws []Window) WindowCheck {
	byName := map[string][]Window{}
	var res WindowCheck
	for _, w := range ws {
		if w.End < w.Start {
			continue
		}
		byName[w.Name] = append(byName[w.Name], w)
		res.Windows++
		if w.Deadline != 0 && w.End >= w.Deadline {
			res.PastDeadline = append(res.PastDeadline, w)
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		list := byName[n]
		sort.SliceStable(list, func(i, j int) bool {
			if list[i].Start != list[j].Start {
				return list[i].Start < list[j].Start
			}
			return list[i].End < list[j].End
		})
		for j := range list {
			for i := range j {
				// list[i].Start <= list[j].Start: they overlap when j
				// started before i's last valid reading (touching ends
				// do not count: the two readings could be the same
				// instant only on a clock too coarse to order them).
				if list[j].Start < list[i].End {
					res.Overlaps = append(res.Overlaps, Overlap{First: list[i], Second: list[j], By: min(list[i].End, list[j].End) - list[j].Start})
				}
			}
			if j > 0 && list[j].Token <= list[j-1].Token {
				res.Inversions = append(res.Inversions, Inversion{Earlier: list[j-1], Later: list[j]})
			}
		}
	}
	return res
}
