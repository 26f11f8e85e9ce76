package tollgate_test

import (
	"os/exec"
	"syscall"
)

// dieWithTests has the kernel kill cmd if the test binary dies first (a
// panic, a timeout), so that no api outlives the tests.
func dieWithTests(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
