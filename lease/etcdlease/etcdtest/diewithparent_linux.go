package etcdtest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the member program die with the test process.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
