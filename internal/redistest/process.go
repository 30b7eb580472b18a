package redistest

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
)

// errNotRunning is returned by process.signal after the process was reaped.
var errNotRunning = errors.New("redistest: process is not running")

// process is one started redis-server. A goroutine reaps it; signals go to
// its process group only while the leader has not been reaped, so a reused
// PID is never signalled (on Linux, where waitZombie can wait without
// reaping).
type process struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once the process has been reaped

	mu     sync.Mutex
	reaped bool
	err    error // cmd.Wait result, set before done is closed
}

// startProcess starts cmd in its own process group and reaps it in the
// background.
func startProcess(cmd *exec.Cmd) (*process, error) {
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go p.reap()
	return p, nil
}

func (p *process) reap() {
	defer close(p.done)
	if waitZombie(p.pid) == nil {
		// The leader has exited but is not reaped yet, so its PID (the
		// group ID) cannot be reused: kill what is left of the group
		// (BGSAVE or AOF-rewrite children), then reap.
		p.mu.Lock()
		defer p.mu.Unlock()
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		p.err = p.cmd.Wait()
		p.reaped = true
		return
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
	p.reaped = true
}

// signal sends sig to the process group.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return errNotRunning
	}
	return syscall.Kill(-p.pid, sig)
}

// exited reports whether the process has been reaped.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
