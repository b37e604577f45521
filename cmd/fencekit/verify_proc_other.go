//go:build !unix

package main

import (
	"errors"
	"os"
)

// signalsAvailable: this system has no SIGSTOP, so the stop and kill
// faults are left out.
const signalsAvailable = false

var errNoSignals = errors.New("SIGSTOP and SIGKILL are not available on this system")

func stopProcess(*os.Process) error     { return errNoSignals }
func continueProcess(*os.Process) error { return nil }
func killProcess(p *os.Process) error   { return p.Kill() }
