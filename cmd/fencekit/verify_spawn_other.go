//go:build !linux

package main

import (
	"os/exec"
	"syscall"
)

// workerProcAttr: no parent-death signal here; a worker whose run died
// exits when it finds its stdin closed.
func workerProcAttr() *syscall.SysProcAttr { return nil }

type spawner struct{}

func newSpawner() *spawner                 { return &spawner{} }
func (*spawner) start(cmd *exec.Cmd) error { return cmd.Start() }
func (*spawner) close()                    {}
