//go:build unix

package ports

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// held keeps the files whose locks reserve took open for the life of the
// process (a file no longer referenced would be closed, and its lock
// released, by its finalizer).
var held []*os.File

// reserve takes, without waiting, an exclusive lock on the file named
// after port in dir, kept until the process ends. It reports false when
// another live process holds that lock: the port is one of its servers'.
func reserve(dir string, port int) (bool, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, err
	}
	held = append(held, f)
	return true, nil
}
