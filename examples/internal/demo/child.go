package demo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/testkit"
)

// Child is a child process started by StartChild.
type Child[E any] struct {
	Cmd *exec.Cmd
	// Events receives the events the child prints on its standard output,
	// one JSON object a line (a line that does not decode is skipped). It
	// is closed when the output ends.
	Events <-chan E
	// Done receives the child's exit (the error of Cmd.Wait) once Events
	// is closed.
	Done <-chan error
}

// StartChild starts this same executable as a child process with the
// argument subcommand, and with cfg as JSON in the environment variable
// envVar (ReadChildConfig reads it on the child's side). The child's
// standard error is this process's. The child is killed (SIGKILL) when this
// process dies, however it dies, stopped or not (package leftover).
func StartChild[E any](subcommand, envVar string, cfg any) (*Child[E], error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, subcommand)
	cmd.Env = append(os.Environ(), envVar+"="+string(js))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	untrack, err := leftover.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return nil, err
	}
	events, done := make(chan E, 64), make(chan error, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			var e E
			if json.Unmarshal(s.Bytes(), &e) == nil {
				events <- e
			}
		}
		close(events)
		err := cmd.Wait()
		untrack()
		done <- err
	}()
	return &Child[E]{Cmd: cmd, Events: events, Done: done}, nil
}

// ReadChildConfig is the child's side of StartChild: it decodes the JSON in
// the environment variable envVar into cfg.
func ReadChildConfig(envVar string, cfg any) error {
	if err := json.Unmarshal([]byte(os.Getenv(envVar)), cfg); err != nil {
		return fmt.Errorf("bad %s: %w", envVar, err)
	}
	return nil
}

// Reporter is the child's side of Child.Events: it prints each event as
// one line of JSON (a failed write is dropped: the orchestrator sees the
// child's exit). It is safe for concurrent use. It is the test kit's, which
// the tests' own child processes use.
type Reporter = testkit.Reporter

// NewReporter returns a reporter that prints on w (a child's os.Stdout).
func NewReporter(w io.Writer) *Reporter { return testkit.NewReporter(w) }
