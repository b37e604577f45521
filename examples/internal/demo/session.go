package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// Session is one run of a demo program, from its first output to its
// clean-up: the context that ends when the program is asked to stop
// (Interrupts), the writers to print on, the run's ledger of what it
// creates (package leftover), the services it uses and its timeline.
type Session struct {
	Program string
	// Ctx ends on SIGINT, SIGTERM, SIGHUP or a closed output pipe.
	Ctx context.Context
	// Out and ErrOut are stdout and stderr, with a closed pipe turned
	// into the end of Ctx.
	Out, ErrOut io.Writer
	// Timeline counts from Begin (Timeline.Restart to count from later).
	Timeline *Timeline
	// Services is set by Provide.
	Services *services.Set

	ledger *leftover.Run
	stop   func()
}

// Begin starts a run of program once its flags are parsed, parseErr
// being the error of parsing them: a request for help (flag.ErrHelp) ends
// the program with exit status 0, a bad flag with 2 after saying why.
// Otherwise it catches the signals that stop the program and opens the
// run's ledger, removing what killed runs left behind (package leftover).
// A nil Session comes with the program's exit status; End must follow any
// other, after everything the run created is removed or kept.
func Begin(program string, parseErr error, stdout, stderr io.Writer) (s *Session, exit int) {
	if errors.Is(parseErr, flag.ErrHelp) {
		return nil, 0
	}
	if parseErr != nil {
		fmt.Fprintf(stderr, "%s: %v\n", program, parseErr)
		return nil, 2
	}
	ctx, out, errOut, stop := Interrupts(context.Background(), stdout, stderr)
	ledger, err := leftover.Begin(ctx, program, func(f string, a ...any) { fmt.Fprintf(errOut, program+": "+f+"\n", a...) })
	if err != nil {
		fmt.Fprintf(errOut, "%s: the run's ledger: %v\n", program, err)
		stop()
		return nil, 2
	}
	return &Session{Program: program, Ctx: ctx, Out: out, ErrOut: errOut, Timeline: NewTimeline(out), ledger: ledger, stop: stop}, 0
}

// Provide finds or starts the services with services.Provide (cfg.Log is
// replaced), printing its progress lines and then the services used on
// Out. Its error says, one service a line, what is missing.
func (s *Session) Provide(cfg services.Config) error {
	cfg.Log = func(f string, a ...any) { fmt.Fprintf(s.Out, "  ... "+f+"\n", a...) }
	svc, err := services.Provide(s.Ctx, cfg)
	if err != nil {
		return fmt.Errorf("cannot run without its services:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	s.Services = svc
	fmt.Fprintln(s.Out, "Services:")
	for _, u := range svc.Used {
		fmt.Fprintln(s.Out, "  "+u)
	}
	fmt.Fprintln(s.Out)
	return nil
}

// End stops the services the run started and closes its ledger: the
// last thing a run does.
func (s *Session) End() {
	if s.Services != nil {
		s.Services.Close()
	}
	s.ledger.End()
	s.stop()
}

// Fail prints "<program>: " and the message on ErrOut, and returns the
// exit status of a run that could not be carried out: 2.
func (s *Session) Fail(format string, args ...any) int {
	fmt.Fprintf(s.ErrOut, s.Program+": "+format+"\n", args...)
	return 2
}

// Incomplete reports err, which stopped the run before its end (with the
// cause, when the program was asked to stop), and returns 2.
func (s *Session) Incomplete(err error) int {
	if cause := context.Cause(s.Ctx); cause != nil && s.Ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	fmt.Fprintf(s.ErrOut, "\n%s: the run could not be completed: %v\n", s.Program, err)
	return 2
}

// WriteJSON writes v, indented, to the file path (--json); an empty path
// writes nothing.
func (s *Session) WriteJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// PrintKeptServers lists, after a run's "Kept (--keep):" lines, the data
// directories of the servers the run started: they stop with the run, and
// their data stays.
func (s *Session) PrintKeptServers() {
	for _, d := range s.Services.Dirs {
		fmt.Fprintf(s.Out, "  the data of a server this demo started (it stops now): %s; remove it when done\n", d)
	}
}
