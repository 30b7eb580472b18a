package faultproxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/pelicanqueue/pelican/internal/poll"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/faultproxy"
	"github.com/pelicanqueue/pelican/internal/leakcheck"
)

// TestMain fails the package when a goroutine of a Proxy outlives the tests.
func TestMain(m *testing.M) {
	leakcheck.Main(m, 5*time.Second, "faultproxy.(*Proxy)")
}

// echo is a server that writes back what it reads and keeps a copy.
type echo struct {
	ln  net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	got bytes.Buffer
}

func startEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	var conns []net.Conn
	var mu sync.Mutex
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			e.wg.Go(func() {
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					e.mu.Lock()
					e.got.Write(buf[:n])
					e.mu.Unlock()
					if _, werr := c.Write(buf[:n]); err != nil || werr != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		e.wg.Wait()
	})
	return e
}

// received returns what the server has read so far.
func (e *echo) received() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got.String()
}

func setup(t *testing.T) (*faultproxy.Proxy, *echo) {
	t.Helper()
	e := startEcho(t)
	p, err := faultproxy.Start(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, e
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// expect reads exactly len(want) bytes from c and checks them.
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %q: got %q, %v", want, got, err)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
}

// silent checks that nothing arrives on c for d, and that c is neither
// closed nor reset meanwhile.
func silent(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %q, %v; want nothing until the deadline", buf[:n], err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, poll.True(what, cond))
}

func TestProxy_Pass(t *testing.T) {
	t.Parallel()
	p, e := setup(t)
	c := dial(t, p)
	write(t, c, "hello")
	expect(t, c, "hello")
	if got := e.received(); got != "hello" {
		t.Errorf("server received %q, want hello", got)
	}
}

func TestProxy_Delay(t *testing.T) {
	t.Parallel()

	t.Run("AddsLatencyPerDirection", func(t *testing.T) {
		t.Parallel()
		p, e := setup(t)
		c := dial(t, p)
		write(t, c, "warm")
		expect(t, c, "warm")
		const upDelay, downDelay = 150 * time.Millisecond, 100 * time.Millisecond
		p.Delay(faultproxy.Latency{Fixed: upDelay}, faultproxy.Latency{Fixed: downDelay})
		sent := time.Now()
		write(t, c, "ping")
		waitFor(t, "the server to receive ping", func() bool { return e.received() == "warmping" })
		if d := time.Since(sent); d < upDelay {
			t.Errorf("the server received ping %v after it was sent, before the %v up delay", d, upDelay)
		}
		expect(t, c, "ping")
		if d := time.Since(sent); d < upDelay+downDelay {
			t.Errorf("ping came back after %v, less than both delays (%v)", d, upDelay+downDelay)
		}
	})

	t.Run("JitterKeepsOrder", func(t *testing.T) {
		t.Parallel()
		p, _ := setup(t)
		c := dial(t, p)
		p.Delay(faultproxy.Latency{Jitter: 20 * time.Millisecond}, faultproxy.Latency{Fixed: time.Millisecond, Jitter: 20 * time.Millisecond})
		var want bytes.Buffer
		for i := range 50 {
			msg := fmt.Sprintf("m%02d;", i)
			want.WriteString(msg)
			write(t, c, msg)
			time.Sleep(time.Millisecond) // separate chunks, each with its own delay
		}
		expect(t, c, want.String())
	})

	t.Run("PassReleasesHeldChunks", func(t *testing.T) {
		t.Parallel()
		p, _ := setup(t)
		c := dial(t, p)
		p.Delay(faultproxy.Latency{Fixed: time.Hour}, faultproxy.Latency{})
		write(t, c, "held")
		silent(t, c, 100*time.Millisecond)
		p.Pass()
		expect(t, c, "held")
	})
}

// Throttle: a reply comes at no more than the rate (a lower bound on its
// time: a slow machine only makes it later), bytes intact; the requests
// are not throttled; 0 lifts the limit.
func TestProxy_Throttle(t *testing.T) {
	t.Parallel()
	p, e := setup(t)
	c := dial(t, p)
	const rate, n = 1 << 20, 1 << 19 // 0.5 s at the rate
	p.Throttle(rate)
	msg := strings.Repeat("0123456789abcdef", n/16)
	start := time.Now()
	write(t, c, msg)
	waitFor(t, "the server got the request", func() bool { return len(e.received()) == n })
	expect(t, c, msg)
	if took, least := time.Since(start), time.Duration(n)*time.Second/rate; took < least {
		t.Errorf("%d bytes at %d B/s came in %v; want at least %v", n, rate, took, least)
	}
	p.Throttle(0)
	write(t, c, "after")
	expect(t, c, "after")
}

func TestProxy_Blackhole(t *testing.T) {
	t.Parallel()
	p, e := setup(t)
	open := dial(t, p)
	write(t, open, "a")
	expect(t, open, "a")

	p.Blackhole()
	write(t, open, "b")
	// Accepted, not refused, and stalled like the open one.
	late := dial(t, p)
	write(t, late, "c")
	silent(t, open, 200*time.Millisecond)
	silent(t, late, 10*time.Millisecond)
	if got := e.received(); got != "a" {
		t.Fatalf("during the blackhole the server received %q, want only the earlier a", got)
	}

	// Healed: what was held is delivered, in order, on both connections.
	p.Pass()
	expect(t, open, "b")
	expect(t, late, "c")
	write(t, open, "d")
	expect(t, open, "d")
}

func TestProxy_DropReplies(t *testing.T) {
	t.Parallel()
	p, e := setup(t)
	p.DropReplies(1, "DROP")
	c := dial(t, p)
	write(t, c, "keep")
	expect(t, c, "keep")
	if n := p.DropsLeft(); n != 1 {
		t.Fatalf("DropsLeft() = %d after a request that does not match, want 1", n)
	}

	write(t, c, "DROP me")
	// Applied: the server got the request; lost: the client gets EOF.
	waitFor(t, "the server to receive the request", func() bool { return e.received() == "keepDROP me" })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
		t.Fatalf("after the dropped reply the client read %q, %v; want EOF and nothing", b, err)
	}
	if n := p.DropsLeft(); n != 0 {
		t.Errorf("DropsLeft() = %d, want 0", n)
	}

	// Armed for one reply only.
	c2 := dial(t, p)
	write(t, c2, "DROP again")
	expect(t, c2, "DROP again")
}

func TestProxy_Refuse(t *testing.T) {
	t.Parallel()
	p, _ := setup(t)
	open := dial(t, p)
	write(t, open, "a")
	expect(t, open, "a")

	p.Refuse()
	_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := open.Read(make([]byte, 8)); n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("an open connection read %d bytes, %v; want ECONNRESET", n, err)
	}
	// A new connection is reset before any byte goes through (the reset may
	// come before the dial returns, or after).
	if c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write([]byte("x"))
		n, err := c.Read(make([]byte, 8))
		var ne net.Error
		if n != 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("a new connection read %d bytes, %v; want it reset", n, err)
		}
		_ = c.Close()
	}

	p.Pass()
	c := dial(t, p)
	write(t, c, "b")
	expect(t, c, "b")
}

func TestProxy_TargetDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	p, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The reset may come before the dial returns, or after.
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 8)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("read %d bytes, %v; want the connection reset", n, err)
	}
}

func TestProxy_Close(t *testing.T) {
	t.Parallel()
	p, e := setup(t)
	c := dial(t, p)
	write(t, c, "a")
	expect(t, c, "a")
	p.Blackhole()
	write(t, c, "held") // a writer waits on the mode
	p.DropReplies(1, "")
	done := make(chan struct{})
	go func() {
		_ = p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a connection held in the blackhole")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 8)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("after Close the client read %d bytes, %v; want the connection closed", n, err)
	}
	if got := e.received(); got != "a" {
		t.Errorf("the server received %q; want the held bytes dropped at Close", got)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Error("the proxy still accepts connections after Close")
	}
}
