package demo

import (
	"os/exec"
	"syscall"
)

// Group follows the child processes an orchestrator starts from its own
// executable (StartChild): the events of all of them arrive on Events, in
// the order each child printed its own, and each child's exit arrives on
// Exits after its last event. Stop ends and waits for those still running.
type Group[E any] struct {
	subcommand, envVar string
	Events             chan E
	Exits              chan Exit
	procs              map[string]*Proc
}

// Proc is a child process of a Group.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	// Killed says the orchestrator killed it (Kill); Exited, that its exit
	// was received (Group.Exited).
	Killed, Exited bool
}

// Exit is the end of a Group's child: Err is the error of its Cmd.Wait.
type Exit struct {
	Name string
	Err  error
}

// NewGroup returns an empty group whose children run this executable with
// the argument subcommand, their configuration in the environment variable
// envVar (see StartChild).
func NewGroup[E any](subcommand, envVar string) *Group[E] {
	return &Group[E]{subcommand: subcommand, envVar: envVar,
		Events: make(chan E, 1024), Exits: make(chan Exit, 64), procs: map[string]*Proc{}}
}

// Start starts the child name with the configuration cfg.
func (g *Group[E]) Start(name string, cfg any) (*Proc, error) {
	c, err := StartChild[E](g.subcommand, g.envVar, cfg)
	if err != nil {
		return nil, err
	}
	go func() {
		for e := range c.Events {
			g.Events <- e
		}
		g.Exits <- Exit{Name: name, Err: <-c.Done}
	}()
	p := &Proc{Name: name, Cmd: c.Cmd}
	g.procs[name] = p
	return p, nil
}

// Exited marks the child of x as exited and returns it.
func (g *Group[E]) Exited(x Exit) *Proc {
	p := g.procs[x.Name]
	p.Exited = true
	return p
}

// Drain passes the events still queued to f. Once every exit is received,
// they are all there: a child's events are queued before its exit is.
func (g *Group[E]) Drain(f func(E)) {
	for {
		select {
		case e := <-g.Events:
			f(e)
		default:
			return
		}
	}
}

// Stop kills the children that have not exited, frozen (SIGSTOP) or not,
// and waits for them, discarding the rest of their events.
func (g *Group[E]) Stop() {
	left := 0
	for _, p := range g.procs {
		if !p.Exited {
			_ = p.Cmd.Process.Signal(syscall.SIGCONT)
			_ = p.Cmd.Process.Kill()
			left++
		}
	}
	for left > 0 {
		select {
		case <-g.Events: // the rest of their output, so that they can end
		case x := <-g.Exits:
			g.Exited(x)
			left--
		}
	}
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Signal sends sig to the child.
func (p *Proc) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Kill ends the child with SIGKILL, as kill -9 would, and marks it Killed.
func (p *Proc) Kill() error {
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	p.Killed = true
	return nil
}

// Proc returns the child name, nil if there is none.
func (g *Group[E]) Proc(name string) *Proc { return g.procs[name] }
