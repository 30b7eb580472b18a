package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Server is a private PostgreSQL server for tests that restart it, started
// with initdb and pg_ctl (on PATH) in a temporary directory, on a free
// 127.0.0.1 port, trust authentication, database "postgres". As root it
// runs as the user "postgres" (initdb refuses root).
type Server struct {
	t    testing.TB
	dir  string
	port int
	cred *syscall.Credential
}

// Start starts a private server, stopped when t ends. It fails t when
// initdb or pg_ctl is missing or the server does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root needs a user postgres to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	root, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	s.dir = filepath.Join(root, "data")
	if s.cred != nil {
		if err := os.Chown(root, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s.run("initdb", "-D", s.dir, "-U", "postgres", "--auth=trust", "--no-sync")
	s.pgctl("start")
	t.Cleanup(func() { s.pgctlQuiet("stop", "-m", "immediate") })
	return s
}

func (s *Server) run(name string, args ...string) {
	s.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = filepath.Dir(s.dir)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("pgtest: %s %v: %v\n%s", name, args, err, out)
	}
}

func (s *Server) pgctlArgs(action string, extra ...string) []string {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", s.port, filepath.Dir(s.dir))
	return append([]string{"-D", s.dir, "-w", "-t", "60", "-o", opts, "-l", filepath.Join(filepath.Dir(s.dir), "log"), action}, extra...)
}

func (s *Server) pgctl(action string, extra ...string) {
	s.t.Helper()
	s.run("pg_ctl", s.pgctlArgs(action, extra...)...)
}

func (s *Server) pgctlQuiet(action string, extra ...string) {
	cmd := exec.Command("pg_ctl", s.pgctlArgs(action, extra...)...)
	cmd.Dir = filepath.Dir(s.dir)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	_ = cmd.Run()
}

// DSN returns the server's connection string.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Open returns a *sql.DB for the server, closed when the test ends.
func (s *Server) Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("pgtest: private server: %v", err)
	}
	return db
}

// Restart stops the server at once (pg_ctl stop -m immediate: every
// connection is cut, as by a crash) and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.pgctl("stop", "-m", "immediate")
	s.pgctl("start")
}
