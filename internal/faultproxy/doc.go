// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a server on this machine: added latency, a network
// partition, a lost reply, refused connections.
//
//	client ──▶ Proxy (127.0.0.1, free port) ──▶ target (a Redis, say)
//
// [Start] listens on a free 127.0.0.1 port and forwards every connection to
// the target address; point the client under test at [Proxy.Addr]. The
// fault is switched at run time, for every connection at once, open or new:
//
//   - [Proxy.Pass]: bytes flow both ways (the initial mode).
//   - [Proxy.Delay]: each chunk of bytes read from one side is written to
//     the other a fixed latency plus a random jitter after it was read,
//     per direction, in order.
//   - [Proxy.Blackhole]: a partition. Nothing is forwarded either way, and
//     nothing is closed or reset: open connections stall, new ones are
//     accepted and stall too. What was held is forwarded, in order, when
//     the mode changes again, as TCP would deliver it after the network
//     healed (so a command sent during the partition may still reach the
//     server after it).
//   - [Proxy.Refuse]: every open connection is reset (RST) and every new one
//     is reset as soon as it is accepted (the port stays bound, so the
//     client sees ECONNRESET or EOF rather than ECONNREFUSED).
//
// [Proxy.DropReplies] arms a fault of its own, orthogonal to the mode: the
// server's reply to each of the next n requests that contain a given string
// is discarded and that connection is closed, after the request was
// delivered: "command applied, reply lost".
//
// [Proxy.Throttle] limits, on top of the mode, the bytes per second each
// connection forwards from the server: a slow link.
//
// When either side closes its connection, the proxy closes both once what
// it read before has been forwarded (no half-close).
//
// Invariants: the proxy listens on 127.0.0.1 only; bytes are never
// reordered, duplicated or altered, only delayed, held or (DropReplies)
// discarded with the connection closed; [Proxy.Close] closes every
// connection and returns when every goroutine of the proxy has returned.
//
// faultproxy is internal and imports nothing from Pelican.
package faultproxy
