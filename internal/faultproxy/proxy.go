package faultproxy

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Latency is the delay one direction adds to each chunk of bytes.
type Latency struct {
	// Fixed is added to every chunk.
	Fixed time.Duration
	// Jitter, when positive, adds a uniform random delay in [0, Jitter].
	// Chunks stay in order: one that drew a shorter delay than the chunk
	// before it leaves right after that one.
	Jitter time.Duration
}

func (l Latency) draw() time.Duration {
	d := l.Fixed
	if l.Jitter > 0 {
		d += rand.N(l.Jitter + 1)
	}
	return d
}

type mode int

const (
	pass mode = iota
	delay
	blackhole
	refuse
)

// direction is the way bytes flow through a connection.
type direction int

const (
	up   direction = iota // client to server
	down                  // server to client
)

// chunkSize bounds one read, and so one chunk.
const chunkSize = 32 << 10

// Proxy forwards TCP connections from a 127.0.0.1 port to a target address
// with the fault currently set. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	mode    mode
	lat     [2]Latency    // by direction, for delay
	changed chan struct{} // closed and replaced at every change of mode
	drops   int           // replies still to drop
	match   []byte        // what a request must contain for its reply to be dropped
	rate    int           // Throttle's bytes per second from the server, 0: none
	conns   map[*conn]struct{}
	closed  bool
}

// conn is one proxied connection: the client's and the one to the target.
type conn struct {
	client, server net.Conn
	// dropReply: a request whose reply is to be dropped was forwarded; the
	// next bytes from the server close the connection instead.
	dropReply atomic.Bool
	once      sync.Once
	gone      chan struct{} // closed with the connection
}

// Start listens on a free 127.0.0.1 port and forwards each connection to
// target, passing bytes through until another mode is set. Call Close when
// done (t.Cleanup(p.Close) in a test).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, changed: make(chan struct{}), conns: make(map[*conn]struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr returns the address clients connect to: 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pass forwards bytes as they come, and releases what Blackhole or Delay
// held (in order).
func (p *Proxy) Pass() { p.set(pass, nil) }

// Delay holds each chunk read from the client for up, and each chunk read
// from the server for down, before writing it on. A chunk's delay is drawn
// when it is first due to leave; chunks held by an earlier Delay or
// Blackhole leave as soon as their own delay has passed.
func (p *Proxy) Delay(up, down Latency) {
	p.set(delay, func() { p.lat = [2]Latency{up, down} })
}

// Blackhole stops forwarding in both directions, without closing or
// resetting anything, until another mode is set: a network partition.
// Connections opened meanwhile are accepted and stall too.
func (p *Proxy) Blackhole() { p.set(blackhole, nil) }

// Refuse resets every open connection, and resets new connections as soon
// as they are accepted, until another mode is set.
func (p *Proxy) Refuse() {
	p.set(refuse, nil)
	p.mu.Lock()
	open := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close(p, true)
	}
}

// DropReplies arms the proxy to drop the replies to the next n requests
// that contain match ("" matches any): a chunk from a client that contains
// match is forwarded to the server as usual, then the next bytes the server
// sends on that connection are discarded and the connection is closed at
// both ends (the client sees EOF without a reply; the server has received
// and, for Redis, executed the request). A chunk is what one read from the
// client returned: for a client that writes each request (or pipeline) in
// one write and waits for its reply before the next one, as go-redis does,
// a chunk is one request. Replies to requests sent before the matching one
// on the same connection would be dropped instead, so match a request sent
// on an idle connection. A later call replaces the arming; n <= 0 disarms.
// It works with every mode (in Blackhole nothing flows until it ends).
func (p *Proxy) DropReplies(n int, match string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops, p.match = max(n, 0), []byte(match)
}

// Throttle limits the bytes each connection forwards from the server to
// the client to bytesPerSecond (a slow link: a large reply takes its size
// over the rate to arrive, a small one about what it did); 0 lifts the
// limit. It works with every mode, on top of it.
func (p *Proxy) Throttle(bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = max(bytesPerSecond, 0)
}

// throttle waits for a chunk of n bytes forwarded from the server to fit
// the rate, and reports false if the connection went meanwhile.
func (p *Proxy) throttle(c *conn, n int) bool {
	p.mu.Lock()
	rate := p.rate
	p.mu.Unlock()
	if rate == 0 {
		return true
	}
	timer := time.NewTimer(time.Duration(n) * time.Second / time.Duration(rate))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-c.gone:
		return false
	}
}

// DropsLeft returns how many replies DropReplies still has to drop.
func (p *Proxy) DropsLeft() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drops
}

// Close stops listening, closes every connection, and returns when every
// goroutine of the proxy has returned. It returns nil, also when called
// again.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	open := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range open {
		c.close(p, false)
	}
	p.wg.Wait()
	return nil
}

// set changes the mode (and, with with, other state under the lock), and
// wakes every writer waiting on the mode.
func (p *Proxy) set(m mode, with func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if with != nil {
		with()
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a failed handshake, say: keep accepting
		}
		if !p.refusing() {
			if server, err := net.DialTimeout("tcp", p.target, 5*time.Second); err == nil {
				p.open(client, server)
				continue
			}
		}
		reset(client)
	}
}

// refusing reports whether new connections are reset: the mode is Refuse,
// or the proxy is closed.
func (p *Proxy) refusing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed || p.mode == refuse
}

// open starts forwarding between client and server, unless the proxy
// started refusing (or closed) meanwhile.
func (p *Proxy) open(client, server net.Conn) {
	c := &conn{client: client, server: server, gone: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.mode == refuse {
		p.mu.Unlock()
		reset(client)
		_ = server.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.pipe(c, up, client, server)
	p.pipe(c, down, server, client)
}

// chunk is what one read returned, and when.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe forwards from src to dst with two goroutines: one reads as bytes
// come, the other writes each chunk when the mode lets it go. When src ends
// (EOF or error), the whole connection is closed (no half-close) once what
// was read before has been written; when a write fails, at once.
func (p *Proxy) pipe(c *conn, dir direction, src, dst net.Conn) {
	chunks := make(chan chunk, 16)
	p.wg.Go(func() {
		defer close(chunks)
		for {
			buf := make([]byte, chunkSize)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case chunks <- chunk{buf[:n], time.Now()}:
				case <-c.gone:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		defer c.close(p, false)
		for ch := range chunks {
			if !p.await(c, dir, ch.at) {
				return
			}
			switch {
			case dir == up:
				p.armDrop(c, ch.b)
			case c.dropReply.Load():
				return // the reply is dropped with the connection
			case !p.throttle(c, len(ch.b)):
				return
			}
			if _, err := dst.Write(ch.b); err != nil {
				return
			}
		}
	})
}

// armDrop marks c when b is a request whose reply is to be dropped. It runs
// before b is written, so the reply cannot come first.
func (p *Proxy) armDrop(c *conn, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drops > 0 && bytes.Contains(b, p.match) {
		p.drops--
		c.dropReply.Store(true)
	}
}

// await waits until a chunk read at at may be written in direction dir, and
// reports false if it never will be (the connection is gone, or reset).
// The chunks of one direction wait one after the other, so they stay in
// order.
func (p *Proxy) await(c *conn, dir direction, at time.Time) bool {
	var due time.Time // drawn once, in Delay
	for {
		p.mu.Lock()
		m, lat, changed := p.mode, p.lat[dir], p.changed
		p.mu.Unlock()
		var timer *time.Timer
		var timeout <-chan time.Time
		switch m {
		case pass:
			return true
		case refuse:
			return false
		case delay:
			if due.IsZero() {
				due = at.Add(lat.draw())
			}
			wait := time.Until(due)
			if wait <= 0 {
				return true
			}
			timer = time.NewTimer(wait)
			timeout = timer.C
		case blackhole: // until the mode changes
		}
		ok := true
		select {
		case <-timeout:
		case <-changed:
		case <-c.gone:
			ok = false
		}
		if timer != nil {
			timer.Stop()
		}
		if !ok {
			return false
		}
	}
}

// close closes both connections of c, resetting the client's when rst, and
// forgets c. Only the first call acts.
func (c *conn) close(p *Proxy, rst bool) {
	c.once.Do(func() {
		close(c.gone)
		if rst {
			reset(c.client)
		} else {
			_ = c.client.Close()
		}
		_ = c.server.Close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	})
}

// reset closes conn with an RST instead of a FIN.
func reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
