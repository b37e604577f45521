// Package demo holds what the example programs (stalewriter, invoicejob)
// share, so that each program's main.go tells its story and little else:
//
//   - a run from start to clean-up: Session (interrupts, the ledger of what
//     the run creates, the services, the exit statuses) and the flags both
//     programs have (Flags, ParseFlags);
//   - the child processes an orchestrator starts from its own executable:
//     Group and StartChild on the orchestrator's side, ReadChildConfig on
//     the child's;
//   - the timeline they print (Timeline);
//   - the stores a run works in: the throwaway PostgreSQL schema and the
//     lease's keys (Stores), the lease stores (LeaseStore,
//     NewLeaseManager) and a DynamoDB table of the run's own (RunTable).
//
// Each program keeps its own scenario, checks and output.
package demo

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"
)

// Timeline prints events with the time since the start of the run.
type Timeline struct {
	mu    sync.Mutex
	start time.Time
	out   io.Writer
}

// NewTimeline returns a timeline that writes to out and counts from now.
func NewTimeline(out io.Writer) *Timeline {
	return &Timeline{start: time.Now(), out: out}
}

// Restart makes the timeline count from now.
func (t *Timeline) Restart() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = time.Now()
}

// Say prints one line: the time of at since the start, who, and the message.
func (t *Timeline) Say(at time.Time, who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "  %+8.3fs  %-12s %s\n", at.Sub(t.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// Rel formats the time of at since the start, as "+1.234s".
func (t *Timeline) Rel(at time.Time) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("%+.3fs", at.Sub(t.start).Seconds())
}

// Elapsed is the time since the start.
func (t *Timeline) Elapsed() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Since(t.start)
}

// RandomID returns 8 random hex digits, to name what one run creates.
func RandomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
