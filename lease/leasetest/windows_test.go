package leasetest

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCheckWindows checks the checker on synthetic windows.
func TestCheckWindows(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	w := func(name string, holder int, token fence.Token, start, end int) Window {
		return Window{Name: name, Holder: fmt.Sprint(holder), Token: token, Start: ms(start), End: ms(end)}
	}
	due := func(w Window, deadline int) Window { w.Deadline = ms(deadline); return w }
	for _, tc := range []struct {
		name         string
		ws           []Window
		windows      int
		overlaps     int
		inversions   int
		pastDeadline int
	}{
		{name: "empty"},
		{name: "one window", ws: []Window{w("a", 1, 1, 0, 10)}, windows: 1},
		{
			name:    "back to back, tokens growing, any input order",
			ws:      []Window{w("a", 2, 7, 20, 30), w("a", 1, 3, 0, 10), w("a", 3, 9, 31, 40)},
			windows: 3,
		},
		{
			name:    "touching ends are not an overlap",
			ws:      []Window{w("a", 1, 1, 0, 10), w("a", 2, 2, 10, 20)},
			windows: 2,
		},
		{
			name:     "the next holder starts before the last valid reading",
			ws:       []Window{w("a", 1, 1, 0, 10), w("a", 2, 2, 9, 20)},
			windows:  2,
			overlaps: 1,
		},
		{
			name:     "a window inside another",
			ws:       []Window{w("a", 1, 1, 0, 100), w("a", 2, 2, 10, 20)},
			windows:  2,
			overlaps: 1,
		},
		{
			name: "every overlapping pair counts once",
			ws: []Window{
				w("a", 1, 1, 0, 100), w("a", 2, 2, 10, 20), w("a", 3, 3, 30, 40),
			},
			windows:  3,
			overlaps: 2,
		},
		{
			name:    "names are independent",
			ws:      []Window{w("a", 1, 5, 0, 10), w("b", 2, 1, 5, 15)},
			windows: 2,
		},
		{
			name:       "a token that goes back",
			ws:         []Window{w("a", 1, 5, 0, 10), w("a", 2, 4, 20, 30)},
			windows:    2,
			inversions: 1,
		},
		{
			name:       "an equal token is an inversion",
			ws:         []Window{w("a", 1, 5, 0, 10), w("a", 2, 5, 20, 30)},
			windows:    2,
			inversions: 1,
		},
		{
			name:       "one window out of place among growing tokens",
			ws:         []Window{w("a", 1, 1, 0, 10), w("a", 2, 9, 20, 30), w("a", 3, 3, 40, 50), w("a", 4, 10, 60, 70)},
			windows:    4,
			inversions: 1,
		},
		{
			name:    "a grant never read valid has no window",
			ws:      []Window{w("a", 1, 1, 0, 100), w("a", 2, 2, 50, 49)},
			windows: 1,
		},
		{
			name:       "overlap and inversion together",
			ws:         []Window{w("a", 1, 8, 0, 50), w("a", 2, 2, 40, 60)},
			windows:    2,
			overlaps:   1,
			inversions: 1,
		},
		{
			name:    "read valid before the deadline",
			ws:      []Window{due(w("a", 1, 1, 0, 10), 11)},
			windows: 1,
		},
		{
			name:         "read valid at the deadline",
			ws:           []Window{due(w("a", 1, 1, 0, 10), 10)},
			windows:      1,
			pastDeadline: 1,
		},
		{
			name:         "read valid past the deadline, alone",
			ws:           []Window{due(w("a", 1, 1, 0, 30), 20), w("b", 2, 1, 0, 30)},
			windows:      2,
			pastDeadline: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]Window(nil), tc.ws...)
			got := CheckWindows(tc.ws)
			if got.Windows != tc.windows || len(got.Overlaps) != tc.overlaps || len(got.Inversions) != tc.inversions || len(got.PastDeadline) != tc.pastDeadline {
				t.Errorf("windows %d, overlaps %v, inversions %v, past deadline %v; want %d windows, %d overlaps, %d inversions, %d past deadline",
					got.Windows, got.Overlaps, got.Inversions, got.PastDeadline, tc.windows, tc.overlaps, tc.inversions, tc.pastDeadline)
			}
			if ok := tc.overlaps+tc.inversions+tc.pastDeadline == 0; got.OK() != ok {
				t.Errorf("OK() = %v, want %v", got.OK(), ok)
			}
			for i := range in {
				if in[i] != tc.ws[i] {
					t.Fatalf("CheckWindows changed its input")
				}
			}
		})
	}
	// The amount of an overlap.
	got := CheckWindows([]Window{w("a", 1, 1, 0, 10), w("a", 2, 2, 7, 20)})
	if len(got.Overlaps) != 1 || got.Overlaps[0].By != ms(3) || got.Overlaps[0].First.Holder != "1" || got.Overlaps[0].Second.Holder != "2" {
		t.Errorf("overlap %+v, want holder 1 then 2 by 3ms", got.Overlaps)
	}
}
