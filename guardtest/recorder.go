package guardtest

import (
	"sync"

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
