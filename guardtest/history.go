package guardtest

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Classify returns the outcome of a write that returned err
// (fence.OutcomeOf: fence.Accepted, fence.Rejected for a stale token,
// fence.Unknown or fence.Failed), and for a stale one the current token
// its *fence.StaleError names. An error that matches fence.ErrStaleToken
// without a *fence.StaleError in its chain is classified fence.Rejected
// with current fence.None, which CheckHistory reports. A guard reports an
// outcome it does not know as fence.Unknown (docs/design.md, invariant 6), so
// fence.Failed means that nothing was applied.
func Classify(err error) (fence.Outcome, fence.Token) {
	o := fence.OutcomeOf(err)
	if se, ok := fence.AsStale(err); ok && o == fence.Rejected {
		return o, se.Current
	}
	return o, fence.None
}

// Op is one write in a History.
type Op struct {
	// Token is the token the write presented; Value the value it wrote.
	// Values should be unique per write, so that a read tells which write
	// it shows.
	Token fence.Token
	Value string
	// Call and Return are when the write was called and when it returned,
	// on one monotonic clock (for example time.Since of one start time).
	Call, Return time.Duration
	// Outcome is how the guard answered.
	Outcome fence.Outcome
	// Current is the current token the *fence.StaleError named (stale
	// only).
	Current fence.Token
}

// History is what concurrent writers of one resource observed: the state
// before the first write was called, every write, and a read made after
// the last write returned.
type History struct {
	// Initial and InitialValue are the resource's token and value before
	// any write of Ops was called (Initial is fence.None when no write was
	// ever accepted).
	Initial      fence.Token
	InitialValue string
	Ops          []Op
	// Final and FinalValue are what a read returned after every write of
	// Ops had returned.
	Final      fence.Token
	FinalValue string
}

// Violation is one property of CheckHistory that a history breaks.
type Violation struct {
	// Rule is the property: "a", "b" or "c" as CheckHistory lists them,
	// or "" for a history that is malformed (an operation returned before
	// it was called, or has no outcome).
	Rule string
	// Ops are the indexes in History.Ops of the writes involved, the one
	// the violation is about first; none for a violation of the final
	// state alone.
	Ops []int
	// Text says what is wrong, naming the operations (their index, token,
	// value, outcome and times).
	Text string
}

func (v Violation) Error() string { return v.Text }

// CheckHistory checks a history as Violations does and returns every
// violation it finds, joined (each a Violation), or nil.
func CheckHistory(h History) error {
	vs := Violations(h)
	errs := make([]error, len(vs))
	for i, v := range vs {
		errs[i] = v
	}
	return errors.Join(errs...)
}

// Violations checks a history of writes to one register guarded by a
// monotone token against properties that every linearizable execution
// has, and returns every violation it finds, in the order of the rules
// below (none for a history that passes). It needs no search over orders,
// so it is sound (a violation is always a real one) but not complete. With
// "w1 before w2" meaning that w1 returned before w2 was called (so w1 takes
// effect before w2 in any linearization):
//
//   - (a) For accepted writes w1 before w2, token(w2) >= token(w1); and no
//     accepted write presents a token below Initial.
//   - (b) A stale write r names a current token greater than the one it
//     presented; that current token is Initial or the token of a write
//     that may have been applied (accepted or unknown) and was called
//     before r returned; and it is at least the token of every accepted
//     write before r.
//   - (c) The final token is at least every accepted token and is Initial
//     or the token of a write that may have been applied (so, without
//     unknown outcomes, it is the greatest accepted token). The final
//     value is the value of a write that may have been applied with the
//     final token (or InitialValue), and no accepted write came after
//     that write (it would have replaced the value). A write whose outcome
//     is unknown may have taken effect at any moment after it was called,
//     even after it returned (its request delayed in the network), so no
//     later write rules it out.
//
// Stale and failed writes are taken to have changed nothing, which is
// what those answers promise.
func Violations(h History) []Violation {
	var vs []Violation
	fail := func(rule string, ops []int, format string, args ...any) {
		vs = append(vs, Violation{Rule: rule, Ops: ops, Text: fmt.Sprintf(format, args...)})
	}
	maybeApplied := func(o Op) bool { return o.Outcome == fence.Accepted || o.Outcome == fence.Unknown }

	maxAccepted := h.Initial
	for i, o := range h.Ops {
		if o.Return < o.Call {
			fail("", []int{i}, "op %d (%s): returned at %v before it was called at %v", i, desc(o), o.Return, o.Call)
		}
		switch o.Outcome {
		case fence.Accepted, fence.Rejected, fence.Unknown, fence.Failed:
		default:
			fail("", []int{i}, "op %d (%s): no outcome", i, desc(o))
		}
		if o.Outcome == fence.Accepted {
			maxAccepted = max(maxAccepted, o.Token)
			if o.Token < h.Initial {
				fail("a", []int{i}, "(a) op %d (%s) accepted below the initial token %d", i, desc(o), h.Initial)
			}
		}
	}

	// (a) accepted writes in real-time order never go down.
	for i, w1 := range h.Ops {
		if w1.Outcome != fence.Accepted {
			continue
		}
		for j, w2 := range h.Ops {
			if w2.Outcome == fence.Accepted && w1.Return < w2.Call && w2.Token < w1.Token {
				fail("a", []int{j, i}, "(a) op %d (%s) was accepted after op %d (%s) had been accepted", j, desc(w2), i, desc(w1))
			}
		}
	}

	// (b) a rejection names a newer token that was stored when it was made.
	for i, r := range h.Ops {
		if r.Outcome != fence.Rejected {
			continue
		}
		if r.Current == fence.None {
			fail("b", []int{i}, "(b) op %d (%s): the stale error does not name the current token", i, desc(r))
			continue
		}
		if r.Current <= r.Token {
			fail("b", []int{i}, "(b) op %d (%s): rejected although the current token %d is not newer", i, desc(r), r.Current)
		}
		found := r.Current == h.Initial
		for _, c := range h.Ops {
			if maybeApplied(c) && c.Token == r.Current && c.Call < r.Return {
				found = true
				break
			}
		}
		if !found {
			fail("b", []int{i}, "(b) op %d (%s): the current token %d is neither the initial token nor that of a write that may have been applied and was called before the rejection returned", i, desc(r), r.Current)
		}
		for j, w := range h.Ops {
			if w.Outcome == fence.Accepted && w.Return < r.Call && r.Current < w.Token {
				fail("b", []int{i, j}, "(b) op %d (%s): names current token %d, older than the token of op %d (%s), accepted before it was called", i, desc(r), r.Current, j, desc(w))
			}
		}
	}

	// (c) the final state is the last applied write.
	if h.Final < maxAccepted {
		var lostOps []int // the accepted writes whose token the final state lacks
		for i, o := range h.Ops {
			if o.Outcome == fence.Accepted && o.Token > h.Final {
				lostOps = append(lostOps, i)
			}
		}
		fail("c", lostOps, "(c) final token %d is below the greatest accepted token %d: an accepted write was lost", h.Final, maxAccepted)
	}
	finalOK := h.Final == h.Initial
	for _, o := range h.Ops {
		if maybeApplied(o) && o.Token == h.Final {
			finalOK = true
			break
		}
	}
	if !finalOK {
		fail("c", nil, "(c) final token %d is neither the initial token nor that of a write that may have been applied", h.Final)
	}
	// The write the final value shows: some op with that value and token
	// (or the initial state) after which no accepted write came. A write of
	// unknown outcome may have landed after every other write.
	var (
		candidates, superseded int
		replacers              []int // the accepted writes that came after each candidate
	)
	consider := func(ret time.Duration, initial bool) {
		candidates++
		for j, w := range h.Ops {
			if w.Outcome == fence.Accepted && (initial || ret < w.Call) && w.Value != h.FinalValue {
				superseded++
				replacers = append(replacers, j)
				return
			}
		}
	}
	if h.Final == h.Initial && h.FinalValue == h.InitialValue {
		consider(0, true)
	}
	for _, o := range h.Ops {
		if o.Outcome == fence.Unknown && o.Token == h.Final && o.Value == h.FinalValue {
			candidates++ // never superseded
		}
		if o.Outcome == fence.Accepted && o.Token == h.Final && o.Value == h.FinalValue {
			consider(o.Return, false)
		}
	}
	switch {
	case candidates == 0:
		fail("c", nil, "(c) final value %q with token %d was written by no write that may have been applied with that token", h.FinalValue, h.Final)
	case candidates == superseded:
		fail("c", replacers, "(c) final value %q with token %d: an accepted write came after the write of that value and should have replaced it", h.FinalValue, h.Final)
	}
	return vs
}

func desc(o Op) string {
	s := fmt.Sprintf("token %d, value %q, %s, called %v, returned %v", o.Token, o.Value, o.Outcome, o.Call, o.Return)
	if o.Outcome == fence.Rejected {
		s += fmt.Sprintf(", current %d", o.Current)
	}
	return s
}
