package periodic

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

const childEnv = "PERIODIC_CHILD"

// schedulerChild is a scheduler subprocess: it runs schedule "hb" (Every
// PERIODIC_EVERY_MS, Tolerance PERIODIC_TOLERANCE_MS, Missed "run-once" if
// PERIODIC_MISSED says so) on PERIODIC_STREAM at REDIS_ADDR until SIGTERM,
// and prints each tick attempt as "<tick ms> <status> <late ms>".
func schedulerChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close()
	every, _ := strconv.Atoi(os.Getenv("PERIODIC_EVERY_MS"))
	tol, _ := strconv.Atoi(os.Getenv("PERIODIC_TOLERANCE_MS"))
	missed := Skip
	if os.Getenv("PERIODIC_MISSED") == "run-once" {
		missed = RunOnce
	}
	s, err := New(rdb, Config{Stream: os.Getenv("PERIODIC_STREAM"), Schedules: []Schedule{{
		Name: "hb", Type: "ping", Every: time.Duration(every) * time.Millisecond,
		Tolerance: time.Duration(tol) * time.Millisecond, Missed: missed,
	}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var mu sync.Mutex
	s.observe = func(_ string, tick time.Time, status string, late time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%d %s %d\n", tick.UnixMilli(), status, late.Milliseconds())
	}
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// child is a scheduler subprocess and what it printed.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	seen []attempt
}

// attempt is one line a child printed.
type attempt struct {
	tick   int64
	status string
	late   int64
}

// startChild starts a scheduler subprocess with env.
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=1", "REDIS_ADDR="+redistest.Addr()), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				continue
			}
			tick, _ := strconv.ParseInt(f[0], 10, 64)
			late, _ := strconv.ParseInt(f[2], 10, 64)
			c.mu.Lock()
			c.seen = append(c.seen, attempt{tick, f[1], late})
			c.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

// kill SIGKILLs the child and waits for it.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop SIGTERMs the child and waits for it to exit.
func (c *child) stop(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Errorf("scheduler %d did not exit within 30s of SIGTERM", c.cmd.Process.Pid)
		c.kill()
	}
	if st := c.cmd.ProcessState; st != nil && st.ExitCode() != 0 {
		t.Errorf("scheduler %d exited with %v", c.cmd.Process.Pid, st)
	}
}

// attempts returns what the child printed so far.
func (c *child) attempts() []attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]attempt(nil), c.seen...)
}
