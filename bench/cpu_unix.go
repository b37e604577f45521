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
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
