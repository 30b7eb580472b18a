package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// xreader sends a consumer's blocking XREADGROUP: a [blockingReader] of its
// own, or its part of a pool's shared read (shared.go).
type xreader interface {
	read(ctx context.Context, args *redis.XReadGroupArgs) ([]streamRead, error)
	// interrupt ends a blocked read, if there is one.
	interrupt()
	// close releases the reader; call it after the last read.
	close()
}

// blockingReader runs the blocking XREADGROUP. On a single-node client it
// uses a connection of its own, whose CLIENT ID lets [blockingReader.interrupt]
// end a blocked read at once with CLIENT UNBLOCK, so that shutdown does not
// wait for Config.Block to pass. Elsewhere (Cluster, or a server without
// CLIENT ID) reads go through the client and shutdown waits at most Block.
type blockingReader struct {
	rdb  redis.UniversalClient
	cl   *redis.Client // rdb, when it is a single-node client
	conn *redis.Conn   // nil: read through rdb; used by the reading goroutine only
	id   atomic.Int64  // CLIENT ID of conn; 0 when not known
	// direct: conn was dropped because the server has no CLIENT ID; reads
	// go through rdb and cannot be interrupted.
	direct atomic.Bool
	// full: the last read returned as many entries as it asked for, so a
	// backlog is likely there and the next read is a raw one (rawread.go)
	// even when blocking reads cannot be (see read). Used by the reading
	// goroutine only.
	full bool
}

func newBlockingReader(rdb redis.UniversalClient) *blockingReader {
	r := &blockingReader{rdb: rdb}
	r.direct.Store(true)
	if cl, ok := rdb.(*redis.Client); ok {
		r.cl, r.conn = cl, cl.Conn()
		r.direct.Store(false)
	}
	return r
}

// renew replaces the reader's connection after an error that was not a
// Redis error reply: a redis.Conn whose connection failed (EOF, reset,
// timeout) answers every later command with "Conn is in a bad state" and
// never reconnects, so keeping it would end all reading after one Redis
// restart.
func (r *blockingReader) renew(err error) {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return // an error reply (NOGROUP, UNBLOCKED): the connection is fine
	}
	_ = r.conn.Close()
	r.conn = r.cl.Conn()
}

// prepare asks for the connection's CLIENT ID, if it is not known yet;
// on a server without CLIENT ID (miniredis) the reader reads through the
// client from then on (direct).
func (r *blockingReader) prepare(ctx context.Context) error {
	if r.conn == nil || r.id.Load() != 0 {
		return nil
	}
	id, err := r.conn.ClientID(ctx).Result()
	var rerr redis.Error
	switch {
	case errors.As(err, &rerr): // the server has no CLIENT ID (miniredis)
		_ = r.conn.Close()
		r.conn = nil
		r.direct.Store(true)
		return nil
	case err != nil:
		r.renew(err)
		return err
	}
	r.id.Store(id)
	return nil
}

// rawBlockMargin is how much longer than a read's BLOCK the client's
// ReadTimeout must be for the read to go raw: go-redis gives a typed
// blocking read BLOCK plus 10 s, a raw one only the ReadTimeout.
const rawBlockMargin = time.Second

// rawBlocks reports whether a raw read may block for block (its BLOCK, 0:
// forever) under the client's ReadTimeout.
func (r *blockingReader) rawBlocks(block time.Duration) bool {
	rt := r.cl.Options().ReadTimeout // go-redis's: -1 or 0 mean no timeout
	return rt <= 0 || (block > 0 && rt >= block+rawBlockMargin)
}

func (r *blockingReader) read(ctx context.Context, args *redis.XReadGroupArgs) ([]streamRead, error) {
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	if r.conn == nil {
		res, err := r.rdb.XReadGroup(ctx, args).Result()
		return readOf(res), err
	}
	if !args.NoAck && args.Claim == 0 {
		// Raw (rawread.go): blocking, when the ReadTimeout leaves room for
		// BLOCK; else without BLOCK when a backlog is likely there (the
		// last read was full), and then, none there after all, typed and
		// blocking as usual below.
		raw := args.Block < 0 || r.rawBlocks(args.Block)
		if raw || r.full {
			r.full = false
			a := *args
			if !raw {
				a.Block = -1
			}
			reply, err := r.conn.DoRaw(ctx, rawArgs(&a)...).Result()
			var res []streamRead
			if err == nil {
				res, err = parseXRead(reply)
			}
			if err == nil {
				r.full = isFull(res, args.Count)
				return res, nil
			}
			if !errors.Is(err, redis.Nil) {
				r.failed(err)
				return nil, err
			}
			if raw {
				return nil, err // nothing came within BLOCK
			}
		}
	}
	typed, err := r.conn.XReadGroup(ctx, args).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.failed(err)
	}
	res := readOf(typed)
	r.full = err == nil && isFull(res, args.Count)
	return res, err
}

// failed handles a read's error on the reader's connection: after a
// failed connection (or a reply it could not parse) it takes a new one.
func (r *blockingReader) failed(err error) {
	r.id.Store(0) // the connection may be replaced: ask again
	r.renew(err)
}

// isFull reports whether a read of up to count entries a stream got that
// many for one of its streams.
func isFull(res []streamRead, count int64) bool {
	for _, x := range res {
		if count > 0 && int64(len(x.entries)) >= count {
			return true
		}
	}
	return false
}

// interrupt ends a blocked read, if there is one, with CLIENT UNBLOCK.
func (r *blockingReader) interrupt() { _, _ = r.unblock() }

// unblock sends CLIENT UNBLOCK for the reader's connection. It reports
// whether a blocked read was ended, and false and an error when the reader
// cannot be interrupted: it reads through the client (no CLIENT ID), or the
// server refused CLIENT UNBLOCK (NOPERM).
func (r *blockingReader) unblock() (bool, error) {
	if r.direct.Load() {
		return false, errNoClientID
	}
	id := r.id.Load()
	if id == 0 {
		return false, nil // no read has asked for the ID yet
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := r.rdb.ClientUnblock(ctx, id).Result()
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false, err
	}
	return n == 1, nil
}

var errNoClientID = errors.New("consumer: the server has no CLIENT ID")

// close releases the reader's connection. Call it from the reading
// goroutine, after its last read.
func (r *blockingReader) close() {
	if r.conn != nil {
		_ = r.conn.Close()
	}
}
