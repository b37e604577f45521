package guardtest

import (
	"errors"
	"sync"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

// Recorder is a fence.WriteObserver that keeps every event it is given,
// for a guard's tests to check what it reports. The zero value is ready;
// it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []fence.WriteEvent
}

// Written implements fence.WriteObserver.
func (r *Recorder) Written(e fence.WriteEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Take returns the events recorded since the last Take, oldest first, and
// forgets them.
func (r *Recorder) Take() []fence.WriteEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// Want is the event one write should report: Guard, Class, Op, Token and
// Outcome must be equal; Resource too, unless it is "".
type Want struct {
	Guard, Class, Op, Resource string
	Token                      fence.Token
	Outcome                    fence.Outcome
}

// One fails t unless exactly one event was recorded since the last Take
// and it is w, with err (the error the caller got, or one wrapping the
// event's) as its Err, the
// outcome fence.OutcomeOf(err), a start time and a positive duration. It
// returns the event.
func (r *Recorder) One(t testing.TB, w Want, err error) fence.WriteEvent {
	t.Helper()
	ev := r.Take()
	if len(ev) != 1 {
		t.Fatalf("%s %s: %d events, want 1: %+v", w.Guard, w.Op, len(ev), ev)
	}
	e := ev[0]
	got := Want{e.Guard, e.Class, e.Op, e.Resource, e.Token, e.Outcome}
	if w.Resource == "" {
		got.Resource = ""
	}
	if got != w {
		t.Fatalf("event %+v; want %+v", got, w)
	}
	// The caller's error is the event's, or wraps it (http.Client wraps
	// its Transport's error in a *url.Error).
	if (e.Err == nil) != (err == nil) || e.Err != nil && e.Err != err && !errors.Is(err, e.Err) || fence.OutcomeOf(err) != w.Outcome {
		t.Fatalf("%s %s: the event's error is %v, the caller got %v (outcome %q)", w.Guard, w.Op, e.Err, err, fence.OutcomeOf(err))
	}
	if e.Ctx == nil || e.Start.IsZero() || e.Duration <= 0 {
		t.Fatalf("%s %s: context %v, start %v, duration %v", w.Guard, w.Op, e.Ctx, e.Start, e.Duration)
	}
	return e
}
