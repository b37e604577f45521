//go:build !linux

package etcdtest

import "os/exec"

// dieWithParent does nothing here: the member program ends when its input
// does, which the test process's death closes.
func dieWithParent(*exec.Cmd) {}
