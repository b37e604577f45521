//go:build linux

package main

import (
	"os/exec"
	"runtime"
	"syscall"
)

// workerProcAttr makes Linux kill a worker when the run dies, even by
// SIGKILL, even while the worker is stopped: its parent-death signal.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// spawner starts the workers from one goroutine locked to its OS thread
// for the whole run: the parent-death signal follows the thread that
// forked the child, and an unlocked goroutine's thread may end (and kill
// the worker) while the run goes on. The thread ends with the run.
type spawner struct{ reqs chan spawnReq }

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		for r := range s.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	s.reqs <- spawnReq{cmd, done}
	return <-done
}

func (s *spawner) close() { close(s.reqs) }
