//go:build !linux

package drivertest

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
