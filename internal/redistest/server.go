package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds each attempt to start a server, and Restart.
	startTimeout = 30 * time.Second // a redis-server beside busy loops took over 10 s to answer
	// exitTimeout bounds the wait for a server to exit after SIGKILL or
	// SHUTDOWN.
	exitTimeout = 10 * time.Second
	// portAttempts is how many free ports Start tries when another process
	// takes the chosen port before redis-server binds it.
	portAttempts = 5
	// pollInterval is the pause between two readiness probes.
	pollInterval = 10 * time.Millisecond
	// probeTimeout bounds one readiness probe (dial, write, read).
	probeTimeout = 500 * time.Millisecond
	// logTailLines is how many log lines failure messages include.
	logTailLines = 30
)

// errPortInUse reports that redis-server exited because its port was taken.
var errPortInUse = errors.New("redistest: port already in use")

// Options configures a server started by Start.
type Options struct {
	// AOF selects persistence: "" runs without any (appendonly no and no
	// RDB save points); "everysec" or "always" turns the append-only file
	// on with that appendfsync policy. RDB save points are off in every
	// mode, so no background save forks while a test runs.
	AOF string

	// Args are extra redis-server arguments, such as
	// []string{"--maxmemory", "20mb"}. They come last on the command line,
	// so they override the harness's own settings.
	Args []string

	// TLS, if not nil, makes the server speak TLS only, with certificates
	// that Start generates (see Server.TLSFiles). Server.Client and the
	// harness's own probes use them.
	TLS *TLSOptions
}

// Server is a redis-server process started by Start, listening on
// 127.0.0.1 with its data directory in t.TempDir(). The process is killed
// and reaped by t.Cleanup. Methods that take no testing.TB fail the test
// given to Start, so call them from that test's goroutine (or a subtest's).
type Server struct {
	t       testing.TB
	opts    Options
	dir     string
	logPath string
	port    int
	busPort int // cluster bus port; 0 unless started by StartCluster

	tlsFiles TLSFiles    // set if opts.TLS is not nil
	tlsConf  *tls.Config // client configuration; nil unless opts.TLS is set

	mu   sync.Mutex
	proc *process // current (or last) process
}

// Start starts a redis-server on a free 127.0.0.1 port, with --save "",
// --dir t.TempDir() and the persistence selected by opts, and returns once
// it answers PING. It fails the test, with the tail of the server's log, if
// the server does not answer within 10 s. If another process takes the port
// before redis-server binds it, Start retries on another port a few times.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	return start(t, opts, false)
}

func start(t testing.TB, opts Options, cluster bool) *Server {
	t.Helper()
	switch opts.AOF {
	case "", "everysec", "always":
	default:
		t.Fatalf(`redistest: Options.AOF (%q) must be "", "everysec" or "always"`, opts.AOF)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	dir := t.TempDir()
	s := &Server{t: t, opts: opts, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	t.Cleanup(s.cleanup)
	if opts.TLS != nil {
		var err error
		if s.tlsFiles, s.tlsConf, err = newTLSFiles(dir); err != nil {
			t.Fatalf("redistest: make TLS certificates: %v", err)
		}
	}
	for attempt := 1; ; attempt++ {
		n := 1
		if cluster {
			n = 2 // client port and cluster bus port
		}
		ports, err := freePorts(n)
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		s.port = ports[0]
		if cluster {
			s.busPort = ports[1]
		}
		err = s.launch(time.Now().Add(startTimeout))
		if err == nil {
			return s
		}
		if errors.Is(err, errPortInUse) && attempt < portAttempts {
			t.Logf("redistest: port %d (or bus port %d) was taken, retrying on another", s.port, s.busPort)
			continue
		}
		t.Fatalf("redistest: redis-server on %s did not start: %v\nlog %s, last lines:\n%s",
			s.Addr(), err, s.logPath, s.logTail())
	}
}

// args is the redis-server command line.
func (s *Server) args() []string {
	args := []string{"--port", strconv.Itoa(s.port)}
	if s.opts.TLS != nil {
		auth := "no"
		if s.opts.TLS.AuthClients {
			auth = "yes"
		}
		args = []string{
			"--port", "0",
			"--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tlsFiles.ServerCert,
			"--tls-key-file", s.tlsFiles.ServerKey,
			"--tls-ca-cert-file", s.tlsFiles.CA,
			"--tls-auth-clients", auth,
		}
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--save", "",
	)
	if s.opts.AOF == "" {
		args = append(args, "--appendonly", "no")
	} else {
		args = append(args, "--appendonly", "yes", "--appendfsync", s.opts.AOF)
	}
	if s.busPort != 0 {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
			// A replica's first sync starts at once, not after 5 s.
			"--repl-diskless-sync-delay", "0",
		)
	}
	return append(args, s.opts.Args...)
}

// launch starts redis-server on s.port and waits until it is ready.
func (s *Server) launch(deadline time.Time) error {
	logFile, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	offset, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return err
	}
	cmd := exec.Command("redis-server", s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile // the log goes to stdout: --logfile is left empty
	cmd.Stderr = logFile
	p, err := startProcess(cmd)
	logFile.Close() // the child has its own descriptor
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()

	err = s.waitReady(p, deadline)
	if err == nil {
		return nil
	}
	if p.exited() {
		if strings.Contains(s.logSince(offset), "Address already in use") {
			return errPortInUse
		}
		return err
	}
	_ = p.signal(syscall.SIGKILL)
	<-p.done
	return err
}

// waitReady polls until the server started as p answers PING, or p exits,
// or the deadline passes.
func (s *Server) waitReady(p *process, deadline time.Time) error {
	for {
		err := s.ready(p.pid)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG before the deadline: %w", err)
		}
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited: %v", p.err)
		case <-time.After(pollInterval):
		}
	}
}

// ready reports whether the server answers PING (LOADING is not ready) and
// is the process pid, not another server that took the port.
func (s *Server) ready(pid int) error {
	pong, err := probe(s.Addr(), s.tlsConf, probeTimeout, "PING")
	if err != nil {
		return err
	}
	if pong != "PONG" {
		return fmt.Errorf("PING replied %q", pong)
	}
	info, err := probe(s.Addr(), s.tlsConf, probeTimeout, "INFO", "server")
	if err != nil {
		return err
	}
	if got := infoField(info, "process_id"); got != strconv.Itoa(pid) {
		return fmt.Errorf("port %d is served by process %s, not %d", s.port, got, pid)
	}
	return nil
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// TLSFiles returns the PEM files of a server started with Options.TLS. It
// fails the test if the server was started without.
func (s *Server) TLSFiles() TLSFiles {
	s.t.Helper()
	if s.opts.TLS == nil {
		s.t.Fatalf("redistest: TLSFiles: %s was started without Options.TLS", s.Addr())
	}
	return s.tlsFiles
}

// Port returns the server's TCP port. It does not change across Restart.
func (s *Server) Port() int {
	return s.port
}

// PID returns the process ID of the current redis-server process, or of the
// last one after Kill9 or Shutdown. It changes on Restart.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc.pid
}

// Client returns a new go-redis client to the server, closed by t.Cleanup.
// Each opts function may change the options (timeouts, retries, protocol)
// before the client is created; Addr is already set, and so is TLSConfig
// (trusting the CA, presenting the client certificate) for a TLS server.
func (s *Server) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: s.Addr()}
	if s.tlsConf != nil {
		o.TLSConfig = s.tlsConf.Clone()
	}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// running returns the current process, failing the test if it has exited.
func (s *Server) running(method string) *process {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p.exited() {
		s.t.Fatalf("redistest: %s: redis-server %s (pid %d) is not running\nlog %s, last lines:\n%s",
			method, s.Addr(), p.pid, s.logPath, s.logTail())
	}
	return p
}

// signal sends sig to the server's process group, failing the test if the
// server is not running.
func (s *Server) signal(method string, sig syscall.Signal) *process {
	s.t.Helper()
	p := s.running(method)
	if err := p.signal(sig); err != nil {
		s.t.Fatalf("redistest: %s: signal pid %d: %v", method, p.pid, err)
	}
	return p
}

// awaitExit waits until p has been reaped, failing the test after
// exitTimeout.
func (s *Server) awaitExit(method string, p *process) {
	s.t.Helper()
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		_ = p.signal(syscall.SIGKILL)
		s.t.Fatalf("redistest: %s: redis-server %s (pid %d) did not exit within %v",
			method, s.Addr(), p.pid, exitTimeout)
	}
}

// Kill9 kills the server with SIGKILL (a crash: no AOF flush, no RDB save)
// and waits until the process has exited. Restart starts it again.
func (s *Server) Kill9() {
	s.t.Helper()
	p := s.signal("Kill9", syscall.SIGKILL)
	s.awaitExit("Kill9", p)
}

// Stop freezes the server with SIGSTOP and returns once the kernel reports
// it stopped. Connections stay open and the kernel still accepts new ones,
// but nothing is answered: a black hole, until Cont. A stopped server is
// still killed by t.Cleanup.
func (s *Server) Stop() {
	s.t.Helper()
	p := s.signal("Stop", syscall.SIGSTOP)
	if err := waitStopState(p.pid, true, time.Now().Add(exitTimeout)); err != nil {
		s.t.Fatalf("redistest: Stop: %v", err)
	}
}

// Cont resumes a server frozen by Stop with SIGCONT and returns once the
// kernel reports it running. Requests sent while it was stopped are then
// answered.
func (s *Server) Cont() {
	s.t.Helper()
	p := s.signal("Cont", syscall.SIGCONT)
	if err := waitStopState(p.pid, false, time.Now().Add(exitTimeout)); err != nil {
		s.t.Fatalf("redistest: Cont: %v", err)
	}
}

// Shutdown stops the server gracefully with SHUTDOWN NOSAVE (the AOF, if
// on, is flushed; no RDB is written) and waits until the process has
// exited. Restart starts it again.
func (s *Server) Shutdown() {
	s.t.Helper()
	p := s.running("Shutdown")
	reply, err := probe(s.Addr(), s.tlsConf, exitTimeout, "SHUTDOWN", "NOSAVE")
	var rerr replyError
	switch {
	case errors.As(err, &rerr):
		s.t.Fatalf("redistest: Shutdown: SHUTDOWN NOSAVE: %v", err)
	case err == nil:
		s.t.Fatalf("redistest: Shutdown: SHUTDOWN NOSAVE replied %q instead of closing the connection", reply)
	case !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET):
		s.t.Fatalf("redistest: Shutdown: SHUTDOWN NOSAVE: %v", err)
	}
	s.awaitExit("Shutdown", p)
}

// Restart starts redis-server again on the same port, directory and
// options, after Kill9 or Shutdown, and returns once it answers PING: a
// server still loading its AOF (LOADING) is not ready. It fails the test if
// the server is still running, or if it does not answer within 10 s (for
// example because another process took the port meanwhile).
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if !p.exited() {
		s.t.Fatalf("redistest: Restart: redis-server %s (pid %d) is still running; call Kill9 or Shutdown first",
			s.Addr(), p.pid)
	}
	if err := s.launch(time.Now().Add(startTimeout)); err != nil {
		if errors.Is(err, errPortInUse) {
			err = fmt.Errorf("another process took port %d (or bus port %d) while the server was down", s.port, s.busPort)
		}
		s.t.Fatalf("redistest: Restart: redis-server on %s did not start: %v\nlog %s, last lines:\n%s",
			s.Addr(), err, s.logPath, s.logTail())
	}
}

// cleanup kills and reaps the current process; it runs in t.Cleanup,
// before t.TempDir removes the data directory.
func (s *Server) cleanup() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		s.t.Errorf("redistest: redis-server pid %d did not exit after SIGKILL", p.pid)
		return
	}
	if s.t.Failed() {
		s.t.Logf("redistest: log of redis-server %s (%s), last lines:\n%s", s.Addr(), s.logPath, s.logTail())
	}
}

// logTail returns the last logTailLines lines of the server's log.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return strings.Join(lines, "\n")
}

// logSince returns the log written after offset.
func (s *Server) logSince(offset int64) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment
// ago. Another process may take one before it is used: callers retry.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // hold all n until all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
