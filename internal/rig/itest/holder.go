package itest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/holder"
)

// Holder is a running holder program (internal/rig/cmd/holder) whose events a
// test reads. It is killed, if still running, and waited for when the
// test ends.
type Holder struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan holder.Event
	done   chan struct{} // closed when the process has exited and its output is read
	err    error         // cmd.Wait's result, set before done is closed

	mu     sync.Mutex
	seen   []holder.Event
	stderr strings.Builder
}

// HolderPath returns the path of the holder program, which Setup must have
// built (helper package internal/rig/cmd/holder).
func HolderPath(t testing.TB) string {
	t.Helper()
	return HelperPath(t, helperDir, "holder")
}

// StartHolder starts the holder program (see HolderPath) with args.
func StartHolder(t testing.TB, args ...string) *Holder {
	t.Helper()
	h := &Holder{t: t, events: make(chan holder.Event, 1024), done: make(chan struct{})}
	h.cmd = exec.Command(HolderPath(t), args...)
	h.cmd.Stderr = writerFunc(func(p []byte) (int, error) { h.mu.Lock(); defer h.mu.Unlock(); return h.stderr.Write(p) })
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start the holder: %v", err)
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			var e holder.Event
			if json.Unmarshal(s.Bytes(), &e) == nil {
				h.events <- e
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		h.err = h.cmd.Wait()
		close(h.events)
		close(h.done)
	}()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			_ = h.cmd.Process.Signal(syscall.SIGCONT)
			_ = h.cmd.Process.Kill()
			<-h.done
		}
	})
	return h
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Pid returns the process id.
func (h *Holder) Pid() int { return h.cmd.Process.Pid }

// Signal sends sig to the process, failing the test on an error.
func (h *Holder) Signal(sig syscall.Signal) time.Time {
	h.t.Helper()
	if err := h.cmd.Process.Signal(sig); err != nil {
		h.t.Fatalf("holder (pid %d): %v: %v", h.Pid(), sig, err)
	}
	return time.Now()
}

// TrySignal sends sig to the process and returns when it did; the error is
// that of a process which had already exited, which a test whose holder
// may end on its own (a lease lost on a starved machine) handles itself.
func (h *Holder) TrySignal(sig syscall.Signal) (time.Time, error) {
	err := h.cmd.Process.Signal(sig)
	return time.Now(), err
}

// Send writes one command line (-do commands).
func (h *Holder) Send(cmd string) {
	h.t.Helper()
	if _, err := io.WriteString(h.stdin, cmd+"\n"); err != nil {
		h.t.Fatalf("holder (pid %d): send %q: %v", h.Pid(), cmd, err)
	}
}

// CloseInput closes the process's standard input (-do commands: it
// releases its lease and exits).
func (h *Holder) CloseInput() { _ = h.stdin.Close() }

// Next returns the next event of the given kind, recording the others; it
// fails the test when the holder reports failed, exits first, or timeout
// passes. It must be called from the test goroutine.
func (h *Holder) Next(kind string, timeout time.Duration) holder.Event {
	h.t.Helper()
	return h.next(kind, timeout, false)
}

// NextHeld is Next for a holder that must keep its lease meanwhile: it
// also fails the test when the holder reports lost first.
func (h *Holder) NextHeld(kind string, timeout time.Duration) holder.Event {
	h.t.Helper()
	return h.next(kind, timeout, true)
}

func (h *Holder) next(kind string, timeout time.Duration, held bool) holder.Event {
	h.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				h.t.Fatalf("holder (pid %d) exited (%v) before reporting %q; it said: %s", h.Pid(), h.err, kind, h.History())
			}
			h.mu.Lock()
			h.seen = append(h.seen, e)
			h.mu.Unlock()
			if e.Kind == kind {
				return e
			}
			if e.Kind == holder.KindFailed || held && e.Kind == holder.KindLost {
				h.t.Fatalf("holder (pid %d) reported %s while the test waited for %q: %s", h.Pid(), e.Kind, kind, e.Text)
			}
		case <-timer.C:
			h.t.Fatalf("holder (pid %d) did not report %q within %v; it said: %s", h.Pid(), kind, timeout, h.History())
		}
	}
}

// Await is NextHeld for a test that handles the loss itself: lost is true,
// and the event the lost one, when the holder reports lost (or exits)
// before kind. Like Next it fails the test on failed and on timeout.
func (h *Holder) Await(kind string, timeout time.Duration) (e holder.Event, lost bool) {
	h.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				return holder.Event{Kind: holder.KindLost, Text: fmt.Sprintf("exited (%v)", h.err)}, true
			}
			h.mu.Lock()
			h.seen = append(h.seen, e)
			h.mu.Unlock()
			switch e.Kind {
			case kind:
				return e, false
			case holder.KindLost:
				return e, true
			case holder.KindFailed:
				h.t.Fatalf("holder (pid %d) reported failed while the test waited for %q: %s", h.Pid(), kind, e.Text)
			}
		case <-timer.C:
			h.t.Fatalf("holder (pid %d) did not report %q within %v; it said: %s", h.Pid(), kind, timeout, h.History())
		}
	}
}

// Drain records the events already written, without waiting.
func (h *Holder) Drain() {
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				return
			}
			h.mu.Lock()
			h.seen = append(h.seen, e)
			h.mu.Unlock()
		default:
			return
		}
	}
}

// Seen returns the events of the given kind recorded so far.
func (h *Holder) Seen(kind string) []holder.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []holder.Event
	for _, e := range h.seen {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// LastSent returns the latest send time of the grant acq and of the
// renewals the holder reported since: the store set the grant's expiry no
// earlier than that plus the TTL.
func (h *Holder) LastSent(acq holder.Event) time.Time {
	last := acq.Sent
	for _, r := range h.Seen("renewed") {
		if r.Sent.After(last) {
			last = r.Sent
		}
	}
	return last
}

// History describes the events recorded so far and the standard error.
func (h *Holder) History() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, e := range h.seen {
		fmt.Fprintf(&b, "\n  %s %s token=%d %s", e.At.Format("15:04:05.000"), e.Kind, e.Token, e.Text)
	}
	if s := strings.TrimSpace(h.stderr.String()); s != "" {
		fmt.Fprintf(&b, "\n  stderr: %s", s)
	}
	return b.String()
}

// Wait waits for the holder to exit and returns cmd.Wait's error.
func (h *Holder) Wait(timeout time.Duration) error {
	h.t.Helper()
	select {
	case <-h.done:
		h.Drain()
		return h.err
	case <-time.After(timeout):
		h.t.Fatalf("holder (pid %d) did not exit within %v", h.Pid(), timeout)
		return nil
	}
}
