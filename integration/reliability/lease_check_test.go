package reliability

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// leaseWindow is one grant of a lease name as its holder saw it, on the test
// process's one monotonic clock (offsets from a common start):
//
//   - Start is when the holder's Acquire returned. The store granted the
//     name at or before that moment.
//   - End is the start of the holder's last reading of Err that returned
//     nil (while it worked, and while its Release ran). The lease was
//     valid, from the holder's own view, at some moment at or after End.
//
// Both ends are taken on the inside of the holder's real validity, so a
// window is never longer than the time the holder held the lease: two
// windows of a name that overlap prove that two holders held it at once
// (docs/design.md, invariant 1), whatever the scheduling and the network did.
// The check catches only the overlaps it can see, and never flags a correct
// implementation. A grant that was never read valid after Acquire returned
// has no window.
type leaseWindow struct {
	Name   string
	Holder int
	Token  uint64
	Start  time.Duration
	End    time.Duration
}

func (w leaseWindow) String() string {
	return fmt.Sprintf("%s holder %d token %d [%v, %v]", w.Name, w.Holder, w.Token, w.Start, w.End)
}

// windowOverlap is two windows of one name that overlap: Second started
// (its Acquire returned) before First's holder last read its lease valid.
type windowOverlap struct {
	First, Second leaseWindow
	// By is how long the two windows overlap.
	By time.Duration
}

// tokenInversion is two windows of one name, in window order, whose tokens
// do not grow: Later started after Earlier but has a token no greater.
type tokenInversion struct {
	Earlier, Later leaseWindow
}

// windowCheck is what checkLeaseWindows found.
type windowCheck struct {
	Windows    int
	Overlaps   []windowOverlap
	Inversions []tokenInversion
}

// checkLeaseWindows checks the windows of a run: no two windows of the same
// name may overlap, and tokens must grow strictly in window order (windows
// ordered by Start). Windows with End before Start are not windows (the
// holder never read its lease valid) and are ignored. It is a pure
// function: the order of ws does not matter and ws is not changed.
//
// Every overlapping pair is reported once. Token order is checked between
// neighbours in window order, so one window out of place is reported
// once or twice, not once per later window.
func checkLeaseWindows(ws []leaseWindow) windowCheck {
	byName := map[string][]leaseWindow{}
	var res windowCheck
	for _, w := range ws {
		if w.End < w.Start {
			continue
		}
		byName[w.Name] = append(byName[w.Name], w)
		res.Windows++
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
					res.Overlaps = append(res.Overlaps, windowOverlap{First: list[i], Second: list[j], By: min(list[i].End, list[j].End) - list[j].Start})
				}
			}
			if j > 0 && list[j].Token <= list[j-1].Token {
				res.Inversions = append(res.Inversions, tokenInversion{Earlier: list[j-1], Later: list[j]})
			}
		}
	}
	return res
}

// TestLeaseHistoryChecker checks the checker on synthetic windows.
func TestLeaseHistoryChecker(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	w := func(name string, holder int, token uint64, start, end int) leaseWindow {
		return leaseWindow{Name: name, Holder: holder, Token: token, Start: ms(start), End: ms(end)}
	}
	for _, tc := range []struct {
		name       string
		ws         []leaseWindow
		windows    int
		overlaps   int
		inversions int
	}{
		{name: "empty"},
		{name: "one window", ws: []leaseWindow{w("a", 1, 1, 0, 10)}, windows: 1},
		{
			name:    "back to back, tokens growing, any input order",
			ws:      []leaseWindow{w("a", 2, 7, 20, 30), w("a", 1, 3, 0, 10), w("a", 3, 9, 31, 40)},
			windows: 3,
		},
		{
			name:    "touching ends are not an overlap",
			ws:      []leaseWindow{w("a", 1, 1, 0, 10), w("a", 2, 2, 10, 20)},
			windows: 2,
		},
		{
			name:     "the next holder starts before the last valid reading",
			ws:       []leaseWindow{w("a", 1, 1, 0, 10), w("a", 2, 2, 9, 20)},
			windows:  2,
			overlaps: 1,
		},
		{
			name:     "a window inside another",
			ws:       []leaseWindow{w("a", 1, 1, 0, 100), w("a", 2, 2, 10, 20)},
			windows:  2,
			overlaps: 1,
		},
		{
			name: "every overlapping pair counts once",
			ws: []leaseWindow{
				w("a", 1, 1, 0, 100), w("a", 2, 2, 10, 20), w("a", 3, 3, 30, 40),
			},
			windows:  3,
			overlaps: 2,
		},
		{
			name:    "names are independent",
			ws:      []leaseWindow{w("a", 1, 5, 0, 10), w("b", 2, 1, 5, 15)},
			windows: 2,
		},
		{
			name:       "a token that goes back",
			ws:         []leaseWindow{w("a", 1, 5, 0, 10), w("a", 2, 4, 20, 30)},
			windows:    2,
			inversions: 1,
		},
		{
			name:       "an equal token is an inversion",
			ws:         []leaseWindow{w("a", 1, 5, 0, 10), w("a", 2, 5, 20, 30)},
			windows:    2,
			inversions: 1,
		},
		{
			name:       "one window out of place among growing tokens",
			ws:         []leaseWindow{w("a", 1, 1, 0, 10), w("a", 2, 9, 20, 30), w("a", 3, 3, 40, 50), w("a", 4, 10, 60, 70)},
			windows:    4,
			inversions: 1,
		},
		{
			name:    "a grant never read valid has no window",
			ws:      []leaseWindow{w("a", 1, 1, 0, 100), w("a", 2, 2, 50, 49)},
			windows: 1,
		},
		{
			name:       "overlap and inversion together",
			ws:         []leaseWindow{w("a", 1, 8, 0, 50), w("a", 2, 2, 40, 60)},
			windows:    2,
			overlaps:   1,
			inversions: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]leaseWindow(nil), tc.ws...)
			got := checkLeaseWindows(tc.ws)
			if got.Windows != tc.windows || len(got.Overlaps) != tc.overlaps || len(got.Inversions) != tc.inversions {
				t.Errorf("windows %d, overlaps %v, inversions %v; want %d windows, %d overlaps, %d inversions",
					got.Windows, got.Overlaps, got.Inversions, tc.windows, tc.overlaps, tc.inversions)
			}
			for i := range in {
				if in[i] != tc.ws[i] {
					t.Fatalf("checkLeaseWindows changed its input")
				}
			}
		})
	}
	// The amount of an overlap.
	got := checkLeaseWindows([]leaseWindow{w("a", 1, 1, 0, 10), w("a", 2, 2, 7, 20)})
	if len(got.Overlaps) != 1 || got.Overlaps[0].By != ms(3) || got.Overlaps[0].First.Holder != 1 || got.Overlaps[0].Second.Holder != 2 {
		t.Errorf("overlap %+v, want holder 1 then 2 by 3ms", got.Overlaps)
	}
}
