package demo

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// Interrupts returns a context that ends when the program is asked to stop:
// SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal went away), or a write to
// stdout or stderr that finds the pipe closed (the reader of `| head`
// exited). The program then cleans up as it would at its normal end.
//
// A broken pipe would otherwise kill the program with SIGPIPE at the first
// write, before it cleans up; so SIGPIPE is ignored for the rest of the
// program's life (and by the children it starts, which inherit that), and
// the returned writers turn the write's EPIPE into the end of the context
// instead, discarding what is written after it. stop releases the signals.
func Interrupts(parent context.Context, stdout, stderr io.Writer) (ctx context.Context, out, errOut io.Writer, stop func()) {
	signal.Ignore(syscall.SIGPIPE)
	ctx, stopSignals := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancelCause(ctx)
	broken := func() { cancel(errBrokenPipe) }
	return ctx, &pipeWriter{w: stdout, broken: broken}, &pipeWriter{w: stderr, broken: broken}, func() {
		cancel(nil)
		stopSignals()
	}
}

// errBrokenPipe is the cause of Interrupts' context after a write found its
// pipe closed.
var errBrokenPipe = errors.New("output pipe closed")

// pipeWriter passes writes on to w until one fails with EPIPE; then it
// calls broken and discards the rest.
type pipeWriter struct {
	w      io.Writer
	broken func()
	closed atomic.Bool
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	if p.closed.Load() {
		return len(b), nil
	}
	n, err := p.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		p.closed.Store(true)
		p.broken()
		return len(b), nil
	}
	return n, err
}

// WantsHelp reports whether args ask for help (-h, -help or --help before
// any "--"), so that a program prints its usage on stdout for a request and
// on stderr only for a mistake.
func WantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}
