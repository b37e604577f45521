//go:build unix

package bench

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user plus system) this process has used
// so far, from getrusage(RUSAGE_SELF): every thread, the Go runtime's own
// (GC, timers) included.
func ProcessCPU() (time.Duration, error) {
	u, err := ProcessUsage()
	return u.CPU, err
}

// Usage is what getrusage(RUSAGE_SELF) says about this process.
type Usage struct {
	// CPU is the user plus system CPU time of all threads.
	CPU time.Duration
	// Switches is the number of context switches, voluntary (a thread
	// blocked: waiting for the network, a futex, a timer) and involuntary.
	// Each one is a trip through the kernel's scheduler; a process that
	// wakes up often pays for it even when it has little to do.
	Switches int64
}

// ProcessUsage returns this process's resource usage so far.
func ProcessUsage() (Usage, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Usage{}, err
	}
	return Usage{
		CPU:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		Switches: int64(ru.Nvcsw + ru.Nivcsw),
	}, nil
}
