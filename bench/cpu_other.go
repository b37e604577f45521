//go:build !unix

package bench

import (
	"errors"
	"time"
)

// ProcessCPU is not implemented on this system.
func ProcessCPU() (time.Duration, error) {
	return 0, errors.New("bench: process CPU time needs getrusage (unix)")
}
