//go:build linux

package redistest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// sysProcAttr puts the server in its own process group, so a signal reaches
// its forked children too, and asks the kernel to SIGKILL it if the thread
// that started it dies (the test binary exiting without running cleanups).
// Go never ends its threads unless a goroutine exits while locked to one,
// which these tests do not do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitZombie blocks until pid has exited, without reaping it (waitid with
// WNOWAIT, as os.Process.blockUntilWaitable does).
func waitZombie(pid int) error {
	const pPID = 1 // P_PID
	var siginfo [128]byte
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&siginfo)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return errno
		}
	}
}

// waitStopState polls /proc/<pid>/stat until the process is stopped (state
// T) or, with stopped false, no longer stopped, or the deadline passes.
func waitStopState(pid int, stopped bool, deadline time.Time) error {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The state follows the command name, which is in parentheses
		// and may itself contain ") ".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return fmt.Errorf("unexpected %s: %q", path, b)
		}
		if (b[i+2] == 'T') == stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: state %c, want stopped=%v", pid, b[i+2], stopped)
		}
		time.Sleep(time.Millisecond)
	}
}
