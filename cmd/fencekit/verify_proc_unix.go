//go:build unix

package main

import (
	"os"
	"syscall"
)

// signalsAvailable: the stop and kill faults can be injected here.
const signalsAvailable = true

func stopProcess(p *os.Process) error     { return p.Signal(syscall.SIGSTOP) }
func continueProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
func killProcess(p *os.Process) error     { return p.Signal(syscall.SIGKILL) }
