package guardtest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// op is a write called at call ms and returned at ret ms.
func op(tok fence.Token, v string, call, ret int, o fence.Outcome) Op {
	return Op{Token: tok, Value: v, Call: time.Duration(call) * time.Millisecond, Return: time.Duration(ret) * time.Millisecond, Outcome: o}
}

func stale(tok, cur fence.Token, v string, call, ret int) Op {
	o := op(tok, v, call, ret, fence.Rejected)
	o.Current = cur
	return o
}

func TestCheckHistory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    History
		want string // a substring of the violation; "" for a valid history
	}{
		{
			name: "sequential writes and a rejection",
			h: History{Initial: 2, InitialValue: "i", Final: 9, FinalValue: "c", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
				stale(3, 5, "b", 2, 3),
				op(9, "c", 4, 5, fence.Accepted),
			}},
		},
		{
			name: "no writes accepted: the initial state stays",
			h: History{Initial: 7, InitialValue: "i", Final: 7, FinalValue: "i", Ops: []Op{
				stale(3, 7, "a", 0, 1),
				op(4, "b", 0, 2, fence.Failed),
			}},
		},
		{
			name: "concurrent writes may take effect in either order",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "b", Ops: []Op{
				op(9, "a", 0, 10, fence.Accepted),
				op(9, "b", 1, 9, fence.Accepted),
				op(3, "c", 2, 8, fence.Accepted), // linearized before both
			}},
		},
		{
			name: "a rejection may name a concurrent write that returned later",
			h: History{Initial: 1, InitialValue: "i", Final: 8, FinalValue: "a", Ops: []Op{
				op(8, "a", 0, 10, fence.Accepted),
				stale(5, 8, "b", 1, 2),
			}},
		},
		{
			name: "an unknown outcome that landed can be the final state",
			h: History{Initial: 1, InitialValue: "i", Final: 12, FinalValue: "u", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
				op(12, "u", 2, 3, fence.Unknown),
				stale(6, 12, "b", 4, 5),
			}},
		},
		{
			name: "an unknown outcome that did not land",
			h: History{Initial: 1, InitialValue: "i", Final: 5, FinalValue: "a", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
				op(12, "u", 2, 3, fence.Unknown),
			}},
		},
		{
			name: "an unknown outcome that landed after a later accepted write",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "u", Ops: []Op{
				op(9, "u", 0, 1, fence.Unknown), // its request delayed past its return
				op(9, "a", 2, 3, fence.Accepted),
			}},
		},
		{
			name: "equal tokens: the same holder writes again",
			h: History{Initial: 1, InitialValue: "i", Final: 4, FinalValue: "b", Ops: []Op{
				op(4, "a", 0, 1, fence.Accepted),
				op(4, "b", 2, 3, fence.Accepted),
			}},
		},

		// Histories that must fail.
		{
			name: "(a) an older token accepted after a newer one returned",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "a", Ops: []Op{
				op(9, "a", 0, 1, fence.Accepted),
				op(4, "b", 2, 3, fence.Accepted),
			}},
			want: "(a) op 1",
		},
		{
			name: "(a) accepted below the initial token",
			h: History{Initial: 6, InitialValue: "i", Final: 6, FinalValue: "b", Ops: []Op{
				op(4, "b", 2, 3, fence.Accepted),
			}},
			want: "below the initial token",
		},
		{
			name: "(b) rejected with a current token that is not newer",
			h: History{Initial: 5, InitialValue: "i", Final: 5, FinalValue: "i", Ops: []Op{
				stale(5, 5, "a", 0, 1),
			}},
			want: "is not newer",
		},
		{
			name: "(b) a stale error that does not name the current token",
			h: History{Initial: 5, InitialValue: "i", Final: 5, FinalValue: "i", Ops: []Op{
				stale(3, fence.None, "a", 0, 1),
			}},
			want: "does not name the current token",
		},
		{
			name: "(b) the current token of a write called after the rejection returned",
			h: History{Initial: 1, InitialValue: "i", Final: 8, FinalValue: "b", Ops: []Op{
				stale(5, 8, "a", 0, 1),
				op(8, "b", 2, 3, fence.Accepted),
			}},
			want: "called before the rejection returned",
		},
		{
			name: "(b) the current token of a write that was itself rejected",
			h: History{Initial: 9, InitialValue: "i", Final: 9, FinalValue: "i", Ops: []Op{
				stale(7, 9, "a", 0, 1),
				stale(5, 7, "b", 2, 3),
			}},
			want: "(b) op 1",
		},
		{
			name: "(b) the current token of a failed write",
			h: History{Initial: 1, InitialValue: "i", Final: 1, FinalValue: "i", Ops: []Op{
				op(8, "a", 0, 1, fence.Failed),
				stale(5, 8, "b", 2, 3),
			}},
			want: "(b) op 1",
		},
		{
			name: "(b) a current token older than a write accepted before the rejection",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "b", Ops: []Op{
				op(6, "a", 0, 1, fence.Accepted),
				op(9, "b", 2, 3, fence.Accepted),
				stale(5, 6, "c", 4, 5),
			}},
			want: "older than the token of op 1",
		},
		{
			name: "(c) an accepted write lost",
			h: History{Initial: 1, InitialValue: "i", Final: 5, FinalValue: "a", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
				op(9, "b", 2, 3, fence.Accepted),
			}},
			want: "an accepted write was lost",
		},
		{
			name: "(c) the final value of a rejected write",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "b", Ops: []Op{
				op(9, "a", 0, 1, fence.Accepted),
				stale(9, 9, "b", 2, 3),
			}},
			want: "written by no write that may have been applied",
		},
		{
			name: "(c) the final value of a failed write",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "b", Ops: []Op{
				op(9, "a", 0, 1, fence.Accepted),
				op(9, "b", 2, 3, fence.Failed),
			}},
			want: "written by no write that may have been applied",
		},
		{
			name: "(c) the final value was replaced by a later accepted write",
			h: History{Initial: 1, InitialValue: "i", Final: 4, FinalValue: "a", Ops: []Op{
				op(4, "a", 0, 1, fence.Accepted),
				op(4, "b", 2, 3, fence.Accepted),
			}},
			want: "should have replaced it",
		},
		{
			name: "(c) the initial value after a write was accepted",
			h: History{Initial: 4, InitialValue: "i", Final: 4, FinalValue: "i", Ops: []Op{
				op(4, "a", 0, 1, fence.Accepted),
			}},
			want: "should have replaced it",
		},
		{
			name: "(c) an unknown outcome cannot land over a newer token",
			h: History{Initial: 1, InitialValue: "i", Final: 9, FinalValue: "u", Ops: []Op{
				op(9, "u", 0, 1, fence.Unknown),
				op(10, "a", 2, 3, fence.Accepted),
			}},
			want: "an accepted write was lost",
		},
		{
			name: "(c) a final token nobody wrote",
			h: History{Initial: 1, InitialValue: "i", Final: 7, FinalValue: "a", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
			}},
			want: "neither the initial token nor that of a write",
		},
		{
			name: "(c) a final token of a failed write",
			h: History{Initial: 1, InitialValue: "i", Final: 7, FinalValue: "b", Ops: []Op{
				op(5, "a", 0, 1, fence.Accepted),
				op(7, "b", 2, 3, fence.Failed),
			}},
			want: "neither the initial token nor that of a write",
		},
		{
			name: "malformed: returned before called",
			h: History{Initial: 1, InitialValue: "i", Final: 5, FinalValue: "a", Ops: []Op{
				op(5, "a", 3, 1, fence.Accepted),
			}},
			want: "before it was called",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckHistory(tc.h)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid history reported: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("violation not found; want one saying %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("got %v; want a violation saying %q", err, tc.want)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want fence.Outcome
		cur  fence.Token
	}{
		{nil, fence.Accepted, 0},
		{fence.Stale("r", 3, 9), fence.Rejected, 9},
		{fence.ErrStaleToken, fence.Rejected, fence.None},
		{fence.ErrOutcomeUnknown, fence.Unknown, 0},
		{errors.Join(fence.ErrOutcomeUnknown, fence.Stale("r", 3, 9)), fence.Unknown, 0},
		{fence.ErrInvalidToken, fence.Failed, 0},
	} {
		if got, cur := Classify(tc.err); got != tc.want || cur != tc.cur {
			t.Errorf("Classify(%v) = %s, %d; want %s, %d", tc.err, got, cur, tc.want, tc.cur)
		}
	}
}

// TestViolationsNameRulesAndOps: each violation says its rule and the
// writes it is about, the one it is about first.
func TestViolationsNameRulesAndOps(t *testing.T) {
	t.Parallel()
	h := History{Initial: 1, InitialValue: "i", Final: 5, FinalValue: "b", Ops: []Op{
		op(9, "a", 0, 1, fence.Accepted),
		op(5, "b", 2, 3, fence.Accepted),
		stale(4, 7, "c", 4, 5),
	}}
	got := Violations(h)
	want := []struct {
		rule string
		ops  []int
	}{
		{"a", []int{1, 0}}, // b (token 5) accepted after a (token 9)
		{"b", []int{2}},    // c names token 7, which nobody wrote
		{"b", []int{2, 0}}, // c names 7, older than a's 9 accepted before it
		{"c", []int{0}},    // the final token 5 lacks a's 9: a was lost
	}
	if len(got) != len(want) {
		t.Fatalf("Violations = %+v; want %d", got, len(want))
	}
	for i, w := range want {
		if got[i].Rule != w.rule || !slices.Equal(got[i].Ops, w.ops) || !strings.HasPrefix(got[i].Text, "("+w.rule+")") {
			t.Errorf("violation %d = %+v; want rule %s, ops %v", i, got[i], w.rule, w.ops)
		}
	}
	err := CheckHistory(h)
	var v Violation
	if !errors.As(err, &v) || v.Rule != "a" || strings.Count(err.Error(), "\n") != len(want)-1 {
		t.Fatalf("CheckHistory = %v; want the same violations joined", err)
	}
	if Violations(History{}) != nil || CheckHistory(History{}) != nil {
		t.Fatal("an empty history has violations")
	}
}
