package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/integration/internal/itest"
)

// binDir holds the helper programs under ./internal/..., built once by
// TestMain.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/examples/internal/leftover.startSpawner.func1"),
	)
}

// mainM builds the helper programs before the tests run and removes them
// after; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	dir, cleanup, err := itest.Setup("integration", services.Config{}, "./internal/...")
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer cleanup()
	binDir = dir
	return w.m.Run()
}

// helperPath returns the path of the helper program built from
// ./internal/<name>.
func helperPath(t testing.TB, name string) string {
	t.Helper()
	return itest.HelperPath(t, binDir, name)
}

// holderEvent is one line of the leaseholder program's output (see
// internal/leaseholder).
type holderEvent struct {
	At       time.Time   `json:"at"`
	Pid      int         `json:"pid"`
	Kind     string      `json:"kind"`
	Token    fence.Token `json:"token"`
	Sent     time.Time   `json:"sent"`
	Deadline time.Time   `json:"deadline"`
	Text     string      `json:"text"`
}

// child is a helper process whose standard output is a stream of JSON
// events.
type child struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	events chan holderEvent
	done   chan struct{} // closed when the process has exited and its output is read
	err    error         // cmd.Wait's result, set before done is closed

	mu     sync.Mutex
	seen   []holderEvent
	stderr strings.Builder
}

// startChild starts a helper program. It is killed, if still running, and
// waited for when the test ends.
func startChild(t testing.TB, name string, args ...string) *child {
	t.Helper()
	c := &child{t: t, name: name, events: make(chan holderEvent, 1024), done: make(chan struct{})}
	c.cmd = exec.Command(helperPath(t, name), args...)
	c.cmd.Stderr = &lockedWriter{mu: &c.mu, b: &c.stderr}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			var e holderEvent
			if err := json.Unmarshal(s.Bytes(), &e); err == nil {
				c.events <- e
			}
		}
		c.err = c.cmd.Wait()
		close(c.events)
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// next returns the child's next event of the given kind, recording the
// others; it fails the test when the child exits first or when timeout
// passes. It must be called from the test goroutine.
func (c *child) next(kind string, timeout time.Duration) holderEvent {
	c.t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-c.events:
			if !ok {
				c.t.Fatalf("%s (pid %d) exited (%v) before reporting %q; it said: %s", c.name, c.cmd.Process.Pid, c.err, kind, c.history())
			}
			c.mu.Lock()
			c.seen = append(c.seen, e)
			c.mu.Unlock()
			if e.Kind == kind {
				return e
			}
			if e.Kind == "failed" || e.Kind == "lost" {
				c.t.Fatalf("%s (pid %d) reported %s while the test waited for %q: %s", c.name, c.cmd.Process.Pid, e.Kind, kind, e.Text)
			}
		case <-timer.C:
			c.t.Fatalf("%s (pid %d) did not report %q within %v; it said: %s", c.name, c.cmd.Process.Pid, kind, timeout, c.history())
		}
	}
}

// drain records the events already written, without waiting.
func (c *child) drain() {
	for {
		select {
		case e, ok := <-c.events:
			if !ok {
				return
			}
			c.mu.Lock()
			c.seen = append(c.seen, e)
			c.mu.Unlock()
		default:
			return
		}
	}
}

// seenKinds returns the events of the given kind recorded so far.
func (c *child) seenKinds(kind string) []holderEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []holderEvent
	for _, e := range c.seen {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func (c *child) history() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, e := range c.seen {
		fmt.Fprintf(&b, "\n  %s %s token=%d %s", e.At.Format("15:04:05.000"), e.Kind, e.Token, e.Text)
	}
	if s := strings.TrimSpace(c.stderr.String()); s != "" {
		fmt.Fprintf(&b, "\n  stderr: %s", s)
	}
	return b.String()
}

// kill sends SIGKILL and returns the time right after it was sent.
func (c *child) kill() time.Time {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("SIGKILL %s: %v", c.name, err)
	}
	return time.Now()
}

// wait waits for the child to exit and returns cmd.Wait's error.
func (c *child) wait(timeout time.Duration) error {
	c.t.Helper()
	select {
	case <-c.done:
		c.drain()
		return c.err
	case <-time.After(timeout):
		c.t.Fatalf("%s (pid %d) did not exit within %v", c.name, c.cmd.Process.Pid, timeout)
		return nil
	}
}
