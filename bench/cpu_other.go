//go:build !unix

package bench

import (
	"errors"
	"time"
)

var errNoRusage = errors.New("bench: process usage needs getrusage (unix)")

// ProcessCPU is not implemented on this system.
func ProcessCPU() (time.Duration, error) { return 0, errNoRusage }

// Usage is what getrusage(RUSAGE_SELF) says about this process.
type Usage struct {
	CPU      time.Duration
	Switches int64
}

// ProcessUsage is not implemented on this system.
func ProcessUsage() (Usage, error) { return Usage{}, errNoRusage }
