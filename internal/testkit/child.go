package testkit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// A test that needs real processes (a worker frozen with SIGSTOP, one
// killed with SIGKILL) runs its own test binary again as the child: its
// TestMain calls ChildMain first, which, when the variable is set, runs
// the child's program instead of the tests and exits.
//
//	func TestMain(m *testing.M) {
//		testkit.ChildMain(workerVar, runWorker) // func runWorker(workerConfig) error
//		goleak.VerifyTestMain(m)
//	}
//
// The child reports what it does as JSON lines on its stdout (Reporter);
// the test reads them, in order, from Child.Events, and speaks to the child
// through Child.Stdin.

// Child is a child process started by StartChild.
type Child[E any] struct {
	Name string
	Cmd  *exec.Cmd
	// Stdin is the child's standard input.
	Stdin io.WriteCloser
	// Events are the lines the child printed on stdout, decoded, in
	// order; a line that does not decode is skipped. Closed at the end of
	// the output.
	Events <-chan E
	// Done receives the child's exit (Cmd.Wait's error) after Events is
	// closed.
	Done <-chan error

	mu     sync.Mutex
	exited bool
	err    error
}

// StartChild starts the running test binary again, with cfg as JSON in
// the environment variable envVar and no test selected, as a child named
// name. Its stderr is the test's log. The child is killed (SIGCONT, then
// SIGKILL) when tb ends, if it is still running.
func StartChild[E any](tb testing.TB, name, envVar string, cfg any) *Child[E] {
	tb.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatalf("child %s: config: %v", name, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envVar+"="+string(js))
	cmd.Stderr = &logWriter{tb: tb, prefix: name + ": "}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("child %s: start: %v", name, err)
	}
	events, done := make(chan E, 256), make(chan error, 1)
	c := &Child[E]{Name: name, Cmd: cmd, Stdin: stdin, Events: events, Done: done}
	go func() {
		s := bufio.NewScanner(stdout)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			var e E
			if json.Unmarshal(s.Bytes(), &e) == nil {
				events <- e
			}
		}
		close(events)
		done <- cmd.Wait()
	}()
	tb.Cleanup(func() {
		if c.Exited() {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		c.Wait(tb, time.Minute)
	})
	return c
}

// Signal sends sig to the child, failing tb if it cannot be sent.
func (c *Child[E]) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := c.Cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("child %s: signal %v: %v", c.Name, sig, err)
	}
}

// Say writes line and a newline to the child's stdin.
func (c *Child[E]) Say(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(c.Stdin, line+"\n"); err != nil {
		tb.Fatalf("child %s: write %q: %v", c.Name, line, err)
	}
}

// Next returns the child's next event for which match is true, failing tb
// if the child's output ends first or none comes within timeout. Events
// passed over are given to skipped, when it is not nil.
func (c *Child[E]) Next(tb testing.TB, timeout time.Duration, what string, match func(E) bool, skipped func(E)) E {
	tb.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e, ok := <-c.Events:
			if !ok {
				tb.Fatalf("child %s: output ended before %s (exit: %v)", c.Name, what, c.Wait(tb, 10*time.Second))
			}
			if match(e) {
				return e
			}
			if skipped != nil {
				skipped(e)
			}
		case <-deadline:
			tb.Fatalf("child %s: no %s within %v", c.Name, what, timeout)
		}
	}
}

// Rest returns the child's remaining events, waiting for its output to
// end (at most timeout).
func (c *Child[E]) Rest(tb testing.TB, timeout time.Duration) []E {
	tb.Helper()
	var rest []E
	deadline := time.After(timeout)
	for {
		select {
		case e, ok := <-c.Events:
			if !ok {
				return rest
			}
			rest = append(rest, e)
		case <-deadline:
			tb.Fatalf("child %s: output did not end within %v", c.Name, timeout)
		}
	}
}

// Wait waits at most timeout for the child to exit (draining what is left
// of its events) and returns Cmd.Wait's error.
func (c *Child[E]) Wait(tb testing.TB, timeout time.Duration) error {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return c.err
	}
	deadline := time.After(timeout)
	for {
		select {
		case <-c.Events:
		case err := <-c.Done:
			c.exited, c.err = true, err
			return err
		case <-deadline:
			tb.Errorf("child %s: did not exit within %v", c.Name, timeout)
			return fmt.Errorf("child %s: still running", c.Name)
		}
	}
}

// Exited reports whether Wait saw the child exit.
func (c *Child[E]) Exited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exited
}

// ChildMain is the child's side of StartChild, called first in TestMain.
// When envVar is not set it returns, and the binary runs its tests.
// When it is set, it decodes it (JSON) into a T, runs run with it and
// exits the process: 0 when run returns nil; 2 when the variable does not
// decode or run returns an error, which it prints on stderr (StartChild
// passes the child's stderr to the test's log, prefixed with its name).
func ChildMain[T any](envVar string, run func(cfg T) error) {
	js, ok := os.LookupEnv(envVar)
	if !ok {
		return
	}
	var cfg T
	err := json.Unmarshal([]byte(js), &cfg)
	if err != nil {
		err = fmt.Errorf("bad %s: %w", envVar, err)
	} else {
		err = run(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(0)
}

// Outcome is what a child reports of one fenced write (or completion):
// accepted, or refused, as stale (naming the presented and the current
// token) or for another reason (Err). Embedded in a child's event type,
// its fields are the event's own in JSON, under their Go names.
type Outcome struct {
	Accepted           bool
	Stale              bool
	Presented, Current fence.Token
	Err                string
}

// OutcomeOf returns the Outcome of a write that returned err.
func OutcomeOf(err error) Outcome {
	o := Outcome{Accepted: err == nil}
	if se, ok := fence.AsStale(err); ok {
		o.Stale, o.Presented, o.Current = true, se.Presented, se.Current
	}
	if err != nil {
		o.Err = err.Error()
	}
	return o
}

// Reporter prints a child's events on its stdout, one JSON object a line.
// It is safe for concurrent use.
type Reporter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

// NewReporter returns a Reporter that prints on w (the child's os.Stdout).
func NewReporter(w io.Writer) *Reporter { return &Reporter{enc: json.NewEncoder(w)} }

// Report prints e; a failed write is dropped (the test sees the exit).
func (r *Reporter) Report(e any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(e)
}

// logWriter passes a child's stderr to the test's log, a line at a time.
type logWriter struct {
	tb     testing.TB
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.tb.Log(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
