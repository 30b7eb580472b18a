package redistest

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// alive reports whether a process with this PID exists (zombies included).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func TestServer_Kill9Restart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		aof      string
		wantKept bool
	}{
		{name: "AOF=always", aof: "always", wantKept: true},
		// Without persistence the key must be lost: proves the kill and
		// restart are real, so the case above can fail.
		{name: "AOF=none", aof: "", wantKept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, Options{AOF: tc.aof})
			c := s.Client(t)
			ctx := t.Context()
			key := Name(t)
			if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			pid := s.PID()

			s.Kill9()
			if alive(pid) {
				t.Fatalf("pid %d still exists after Kill9", pid)
			}
			s.Restart()
			if s.PID() == pid {
				t.Fatalf("PID after Restart = %d, want a new process", pid)
			}

			got, err := c.Get(ctx, key).Result()
			switch {
			case tc.wantKept && err != nil:
				t.Fatalf("GET after Kill9+Restart: %v, want the key kept", err)
			case tc.wantKept && got != "v":
				t.Fatalf("GET after Kill9+Restart = %q, want %q", got, "v")
			case !tc.wantKept && !errors.Is(err, redis.Nil):
				t.Fatalf("GET after Kill9+Restart = %q, %v; want redis.Nil", got, err)
			}
		})
	}
}

func TestServer_StopCont(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{})
	const readTimeout = 200 * time.Millisecond
	c := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = readTimeout
		o.MaxRetries = -1 // one attempt, so the timeout is exactly one ReadTimeout
	})
	ctx := t.Context()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING before Stop: %v", err)
	}

	s.Stop()
	start := time.Now()
	err := c.Ping(ctx).Err()
	elapsed := time.Since(start)
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("PING while stopped: err = %v, want a timeout", err)
	}
	if elapsed < readTimeout || elapsed > 10*readTimeout {
		t.Errorf("PING while stopped returned after %v, want about %v", elapsed, readTimeout)
	}

	s.Cont()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Cont: %v", err)
	}
}

func TestServer_ShutdownRestart(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{})
	c := s.Client(t)
	ctx := t.Context()
	key := Name(t)
	if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	pid := s.PID()

	s.Shutdown()
	if alive(pid) {
		t.Fatalf("pid %d still exists after Shutdown", pid)
	}
	if log := s.logSince(0); !strings.Contains(log, "ready to exit, bye bye") {
		t.Errorf("log has no graceful-exit line after Shutdown:\n%s", s.logTail())
	}
	if _, err := probe(s.Addr(), nil, probeTimeout, "PING"); err == nil {
		t.Fatalf("PING after Shutdown succeeded, want a refused connection")
	}

	s.Restart()
	if s.PID() == pid {
		t.Fatalf("PID after Restart = %d, want a new process", pid)
	}
	if err := c.Get(ctx, key).Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Shutdown NOSAVE + Restart without persistence: %v, want redis.Nil", err)
	}
}

func TestServer_RestartRunning(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{})
	msg := runFake(t, func(tb testing.TB) {
		s.t = tb // methods fail the test given to Start
		s.Restart()
	})
	s.t = t
	if !strings.Contains(msg, "still running") {
		t.Fatalf("Restart of a running server: Fatalf = %q, want it to say the server is still running", msg)
	}
	if err := s.Client(t).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING after refused Restart: %v", err)
	}
}

func TestStart_cleanupKills(t *testing.T) {
	t.Parallel()
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stop), func(t *testing.T) {
			t.Parallel()
			var pid int
			msg := runFake(t, func(tb testing.TB) {
				s := Start(tb, Options{AOF: "everysec"})
				pid = s.PID()
				if stop {
					s.Stop()
				}
			})
			if msg != "" {
				t.Fatalf("Start: %s", msg)
			}
			if pid == 0 || alive(pid) {
				t.Fatalf("pid %d still exists after cleanup", pid)
			}
		})
	}
}

func TestStart_badOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{name: "AOF", opts: Options{AOF: "sometimes"}, want: []string{"Options.AOF"}},
		{
			name: "Args",
			opts: Options{Args: []string{"--no-such-directive", "x"}},
			// the log tail is in the message
			want: []string{"did not start", "Bad directive"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msg := runFake(t, func(tb testing.TB) { Start(tb, tc.opts) })
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("Fatalf = %q, want it to contain %q", msg, w)
				}
			}
		})
	}
}

func TestServer_launchPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	s := &Server{t: t, dir: dir, logPath: dir + "/redis.log", port: l.Addr().(*net.TCPAddr).Port}
	t.Cleanup(s.cleanup)
	if err := s.launch(time.Now().Add(startTimeout)); !errors.Is(err, errPortInUse) {
		t.Fatalf("launch on a taken port: %v, want errPortInUse", err)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	cc := c.Client(t)
	ctx := t.Context()
	name := Name(t)

	// {a}, {b} and {c} hash to slots 15495, 3300 and 7365: one per master.
	keys := []string{"{a}:" + name, "{b}:" + name, "{c}:" + name}
	for _, k := range keys {
		if err := cc.Set(ctx, k, "v:"+k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	// Nodes()[i] owns the i-th third of the slots.
	wantOwner := map[string]int{keys[0]: 2, keys[1]: 0, keys[2]: 1}
	for _, k := range keys {
		got, err := cc.Get(ctx, k).Result()
		if err != nil || got != "v:"+k {
			t.Fatalf("GET %s = %q, %v; want %q", k, got, err, "v:"+k)
		}
		var holders []int
		for i, n := range c.Nodes() {
			if reply, err := probe(n.Addr(), nil, probeTimeout, "EXISTS", k); err == nil && reply == "1" {
				holders = append(holders, i)
			}
		}
		if len(holders) != 1 || holders[0] != wantOwner[k] {
			t.Errorf("%s is held by nodes %v, want only node %d", k, holders, wantOwner[k])
		}
	}

	const script = `redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
return redis.call('GET', KEYS[2])`
	got, err := cc.Eval(ctx, script, []string{"{q1}:a", "{q1}:b"}, "x").Result()
	if err != nil || got != "x" {
		t.Fatalf("EVAL on {q1}:a {q1}:b = %v, %v; want x", got, err)
	}
	if _, err := cc.Eval(ctx, script, []string{"a", "b"}, "x").Result(); err == nil ||
		!strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("EVAL on a b: err = %v, want CROSSSLOT", err)
	}
}

// TestStartClusterReplicas kills a master of a 3-master cluster with one
// replica each: its replica owns its slots afterwards, and a key written
// before the kill (and replicated: WAIT) is still there.
func TestStartClusterReplicas(t *testing.T) {
	t.Parallel()
	c := StartClusterReplicas(t, 3, 1)
	if n := len(c.Nodes()); n != 6 {
		t.Fatalf("Nodes() has %d servers, want 6", n)
	}
	masters := c.Masters()
	for i, m := range masters {
		if m != c.Nodes()[i] {
			t.Fatalf("Masters()[%d] = %s, want the created master %s", i, m.Addr(), c.Nodes()[i].Addr())
		}
	}
	cc := c.Client(t, func(o *redis.ClusterOptions) { o.ClusterStateReloadInterval = time.Second })
	ctx := t.Context()
	key := "{b}:" + Name(t) // slot 3300: the first master's
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Wait until the replica holds the key, so the kill loses nothing.
	for deadline := time.Now().Add(10 * time.Second); ; {
		nodes, err := ClusterNodes(masters[0])
		if err != nil {
			t.Fatal(err)
		}
		var replica *Server
		for _, n := range nodes {
			if n.Master != "" {
				for _, m := range nodes {
					if m.ID == n.Master && m.Addr == masters[0].Addr() {
						replica = c.server(n.Addr)
					}
				}
			}
		}
		if replica == nil {
			t.Fatal("the first master has no replica")
		}
		// A replica redirects key commands (MOVED) without READONLY.
		if v, err := probe(replica.Addr(), nil, probeTimeout, "DBSIZE"); err == nil && v == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key never reached the replica")
		}
		time.Sleep(pollInterval)
	}
	promoted := c.KillMaster(masters[0])
	if promoted == masters[0] {
		t.Fatal("KillMaster returned the killed master")
	}
	now := c.Masters()
	if len(now) != 3 || now[0] != promoted {
		t.Fatalf("after the failover the masters are %v, want %s first", now, promoted.Addr())
	}
	// The client reloads its slot map every second (see Cluster.Client).
	var got string
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		if got, err = cc.Get(ctx, key).Result(); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollInterval) // the client learns the new topology from its errors
	}
	if got != "v" {
		t.Fatalf("GET %s after the failover = %q, %v; want v", key, got, err)
	}
}

func TestShared(t *testing.T) {
	t.Parallel()
	t.Run("reachable", func(t *testing.T) {
		t.Parallel()
		s := Start(t, Options{})
		if err := shared(t, s.Addr()).Ping(t.Context()).Err(); err != nil {
			t.Fatalf("PING: %v", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		msg := runFake(t, func(tb testing.TB) { shared(tb, addr) })
		if !strings.Contains(msg, "REDIS_ADDR") || !strings.Contains(msg, addr) {
			t.Fatalf("Fatalf = %q, want it to name REDIS_ADDR and %s", msg, addr)
		}
	})
}

func TestAddr(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got := addrFrom(getenv); got != "127.0.0.1:6379" {
		t.Errorf("addrFrom(unset) = %q, want 127.0.0.1:6379", got)
	}
	env["REDIS_ADDR"] = "10.0.0.1:7000"
	if got := addrFrom(getenv); got != "10.0.0.1:7000" {
		t.Errorf("addrFrom(REDIS_ADDR=10.0.0.1:7000) = %q", got)
	}
}

func TestName(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^t:[A-Za-z0-9_./-]{1,64}:[0-9a-f]{8}$`)
	for _, sub := range []string{"plain", "with {braces} and:colons, spaces", strings.Repeat("long", 40)} {
		t.Run(sub, func(t *testing.T) {
			t.Parallel()
			a, b := Name(t), Name(t)
			if !valid.MatchString(a) || strings.ContainsAny(a, "{}") {
				t.Errorf("Name = %q, want it to match %v", a, valid)
			}
			if !strings.HasPrefix(a, "t:TestName/") {
				t.Errorf("Name = %q, want prefix t:TestName/", a)
			}
			if a == b {
				t.Errorf("two calls returned the same name %q", a)
			}
		})
	}
}

// fakeTB records Fatalf and Cleanup calls, so tests can check how the
// harness fails and that its cleanups leave nothing behind. Everything else
// goes to the real test.
type fakeTB struct {
	testing.TB

	mu       sync.Mutex
	fatal    string
	cleanups []func()
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fatal != ""
}

// runFake runs fn with a fakeTB on its own goroutine (Fatalf ends it with
// runtime.Goexit), then runs the recorded cleanups, last first, and returns
// the Fatalf message, or "" if fn did not fail.
func runFake(t *testing.T, fn func(testing.TB)) string {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f.fatal
}

func TestStart_TLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		authClients bool
	}{
		{name: "AuthClients", authClients: true},
		{name: "NoClientAuth", authClients: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, Options{TLS: &TLSOptions{AuthClients: tc.authClients}})
			ctx := t.Context()
			noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
			if err := s.Client(t, noRetry).Set(ctx, Name(t), "v", 0).Err(); err != nil {
				t.Fatalf("SET over TLS with the client certificate: %v", err)
			}

			plain := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
			defer plain.Close()
			if err := plain.Ping(ctx).Err(); err == nil {
				t.Errorf("PING in plain text: no error, want the server to speak TLS only")
			}

			noCert := s.Client(t, noRetry, func(o *redis.Options) { o.TLSConfig.Certificates = nil })
			err := noCert.Ping(ctx).Err()
			if tc.authClients && err == nil {
				t.Errorf("PING without a client certificate: no error, want it refused")
			}
			if !tc.authClients && err != nil {
				t.Errorf("PING without a client certificate: %v, want PONG", err)
			}
		})
	}
}

func TestServer_TLSFilesWithoutTLS(t *testing.T) {
	t.Parallel()
	msg := runFake(t, func(tb testing.TB) { Start(tb, Options{}).TLSFiles() })
	if !strings.Contains(msg, "without Options.TLS") {
		t.Errorf("Fatalf = %q, want it to name Options.TLS", msg)
	}
}

// A StallWatch reports a stall still going on while Redis is frozen, and
// then records the time it did not answer as one stall that covers it.
func TestStallWatch(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{})
	w := WatchStalls(s.Client(t), 100*time.Millisecond)
	defer w.Stop()
	covers := func(from, to time.Time) bool {
		for _, st := range w.Stalls() {
			if !st.Start.After(from) && !st.End.Before(to) {
				return true
			}
		}
		return false
	}
	s.Stop()
	stopped := time.Now()
	time.Sleep(300 * time.Millisecond) // the stall
	if d, least := w.Longest(), time.Since(stopped); d < least {
		t.Errorf("while Redis is stopped: longest stall %v; want at least the %v since it was stopped", d, least)
	}
	resumed := time.Now() // no reply can come before
	s.Cont()
	deadline := resumed.Add(10 * time.Second)
	for !covers(stopped, resumed) {
		if time.Now().After(deadline) {
			t.Fatalf("stalls %v; want one covering %v to %v", w.Stalls(), stopped, resumed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d, want := w.Within(stopped, resumed), resumed.Sub(stopped); d != want {
		t.Errorf("stalled %v of the %v Redis was stopped, want all of it", d, want)
	}
	if d := w.Within(resumed.Add(time.Hour), resumed.Add(2*time.Hour)); d != 0 {
		t.Errorf("stalled %v of a time to come, want 0", d)
	}
}

// A CallTimer adds up the time its client waits for replies, commands and
// pipelines, and nothing while the client is idle.
func TestCallTimer(t *testing.T) {
	t.Parallel()
	rdb := Shared(t)
	var ct CallTimer
	rdb.AddHook(&ct)
	key := Name(t)
	time.Sleep(100 * time.Millisecond) // idle: not counted
	start := time.Now()
	if err := rdb.BLPop(t.Context(), time.Second, key).Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("BLPOP: %v, want a timeout (redis.Nil)", err)
	}
	if _, err := rdb.Pipelined(t.Context(), func(p redis.Pipeliner) error {
		p.BLPop(t.Context(), time.Second, key)
		return nil
	}); !errors.Is(err, redis.Nil) {
		t.Fatalf("pipelined BLPOP: %v, want a timeout (redis.Nil)", err)
	}
	// At most: a new connection's handshake may be counted twice (inside
	// the call that dials it), and a loaded machine may stretch it.
	if got, most := ct.Total(), time.Since(start)+500*time.Millisecond; got < 2*time.Second || got > most {
		t.Errorf("Total %v after two 1 s BLPOPs in %v; want at least 2 s and at most that", got, most)
	}
}

// Uncovered bounds the gaps between arrivals by the stretches that hold no
// whole call, and counts nothing where calls are dense.
func TestUncovered(t *testing.T) {
	t0 := time.Now()
	at := func(ms ...int) []Call {
		var cs []Call
		for i := 0; i < len(ms); i += 2 {
			cs = append(cs, Call{t0.Add(time.Duration(ms[i]) * time.Millisecond), t0.Add(time.Duration(ms[i+1]) * time.Millisecond)})
		}
		return cs
	}
	for _, tc := range []struct {
		calls []Call
		want  time.Duration
	}{
		{at(0, 2, 1, 3, 50, 52, 51, 53), 51 * time.Millisecond}, // from B's start to C's return
		{at(50, 52, 0, 2, 51, 53, 1, 3), 51 * time.Millisecond}, // unsorted
		{at(0, 2, 1, 3, 4, 6, 5, 7, 8, 10), 0},
		{at(0, 2, 20, 22, 40, 42), 42 * time.Millisecond}, // two stretches that overlap: [0,22] and [20,42]
		{at(0, 2), 0},
	} {
		if got := Uncovered(tc.calls, 10*time.Millisecond); got != tc.want {
			t.Errorf("Uncovered(%v) = %v, want %v", tc.calls, got, tc.want)
		}
	}
}
