//go:build unix && !linux

package redistest

import (
	"errors"
	"syscall"
	"time"
)

// sysProcAttr puts the server in its own process group, so a signal reaches
// its forked children too.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitZombie is not available here: process.reap falls back to cmd.Wait.
func waitZombie(int) error { return errors.ErrUnsupported }

// waitStopState cannot observe the process state here; SIGSTOP and SIGCONT
// are delivered asynchronously but promptly.
func waitStopState(int, bool, time.Time) error { return nil }
