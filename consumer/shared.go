package consumer

// Shared reads: the queues of a Pool that one XREADGROUP can read (the same
// group and consumer name; on Redis Cluster, streams in one hash slot too)
// form a read group, served by one blocking read on one connection. Each
// queue's read loop (intake.go) still decides when it reads and for how
// many entries; instead of sending XREADGROUP itself it hands the request
// to its group's sharedReader, which reads every stream with a request
// waiting in one command and answers each request with its stream's
// entries. A queue without room sends no request, so it is left out. When a
// request arrives (or one is cancelled, or wants an earlier end) while the
// shared read blocks without it, the read is interrupted with CLIENT
// UNBLOCK from another connection and sent again with it; where the server
// has no CLIENT ID or refuses CLIENT UNBLOCK, reads of several queues block
// at most sharedFallbackBlock instead.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

// sharedFallbackBlock bounds a shared read's block time when it cannot be
// interrupted, so that a queue that gets room waits at most this long.
const sharedFallbackBlock = 100 * time.Millisecond

// readGroupKey returns the key of the read group of a queue reading stream
// as group/consumer through rdb, and false when the queue reads alone
// (clients other than a single-node or cluster client: a Ring's streams
// may be on different servers).
func readGroupKey(rdb redis.UniversalClient, stream, group, consumer string) (string, bool) {
	k := strconv.Itoa(len(group)) + ":" + group + consumer
	switch rdb.(type) {
	case *redis.Client:
		return k, true
	case *redis.ClusterClient:
		return strconv.Itoa(keyslot.Of(stream)) + "/" + k, true
	}
	return "", false
}

// sharedReader is one read group's blocking read.
type sharedReader struct {
	rdb             redis.UniversalClient
	group, consumer string
	stop            chan struct{}
	wake            chan struct{} // buffered 1: a request arrived or was cancelled
	kick            chan struct{} // buffered 1: the read in flight is stale
	members         int
	unblockable     atomic.Bool // false once interrupting proved impossible
	reads           atomic.Uint64

	mu      sync.Mutex
	pending []*readReq // not answered yet, in arrival order
	flight  []*readReq // in the read now; nil while none is
	end     time.Time  // when the read in flight ends at the latest
	stale   bool       // a request waits that the read in flight does not serve
	reader  *blockingReader
	wg      sync.WaitGroup
}

// readReq is one queue's read: up to count entries of stream, waiting
// until deadline at most.
type readReq struct {
	stream    string
	count     int64
	deadline  time.Time
	cancelled bool // guarded by the reader's mu
	skipped   bool // left out of the last read for its small room; guarded by mu
	res       []streamRead
	err       error
	done      chan struct{}
}

func newSharedReader(rdb redis.UniversalClient, group, consumer string, members int) *sharedReader {
	s := &sharedReader{rdb: rdb, group: group, consumer: consumer, members: members,
		stop: make(chan struct{}), wake: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
	s.unblockable.Store(true)
	s.wg.Go(s.loop)
	s.wg.Go(s.interrupter)
	return s
}

// close stops the reader once no queue reads through it any more.
func (s *sharedReader) close() {
	close(s.stop)
	s.wg.Wait()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// member returns the reader of one queue of the group.
func (s *sharedReader) member() xreader { return sharedMember{s} }

// sharedMember is a queue's handle on its group's sharedReader.
type sharedMember struct{ s *sharedReader }

func (m sharedMember) read(ctx context.Context, args *redis.XReadGroupArgs) ([]streamRead, error) {
	s := m.s
	r := &readReq{stream: args.Streams[0], count: args.Count, deadline: time.Now().Add(args.Block), done: make(chan struct{})}
	s.mu.Lock()
	s.pending = append(s.pending, r)
	s.markStale()
	s.mu.Unlock()
	signal(s.wake)
	select {
	case <-r.done:
	case <-ctx.Done():
		s.mu.Lock()
		r.cancelled = true
		s.markStale()
		s.mu.Unlock()
		signal(s.wake)
		<-r.done // entries read meanwhile are the caller's to give back
	}
	return r.res, r.err
}

func (sharedMember) interrupt() {} // a read ends when its context does
func (sharedMember) close()     {}

// markStale notes that the read in flight, if there is one, no longer
// serves the requests as they are: one came after it was sent (and may
// want an earlier end), or one was cancelled. Call it with s.mu held.
func (s *sharedReader) markStale() {
	if s.flight != nil {
		s.stale = true
		signal(s.kick)
	}
}

// answer ends r with res and err. Call it with s.mu held.
func answer(r *readReq, res []streamRead, err error) {
	r.res, r.err = res, err
	close(r.done)
}

// loop sends the group's reads while requests wait.
func (s *sharedReader) loop() {
	ctx := context.Background()
	retried := false // an error no stream was named in was retried once
	defer func() {
		if s.reader != nil {
			s.reader.close()
		}
	}()
	for {
		s.mu.Lock()
		keep := s.pending[:0]
		for _, r := range s.pending {
			if r.cancelled {
				answer(r, nil, redis.Nil)
			} else {
				keep = append(keep, r)
			}
		}
		clear(s.pending[len(keep):])
		s.pending = keep
		if len(s.pending) == 0 {
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-s.stop:
				return
			}
		}
		first := s.pending[0].stream
		s.mu.Unlock()
		reader, err := s.resolve(ctx, first)
		if err == nil {
			err = reader.prepare(ctx)
		}
		if err != nil {
			s.drop()
		} else if reader.direct.Load() {
			s.unblockable.Store(false)
		}
		s.mu.Lock()
		if err != nil { // no node or connection to read from: each queue backs off
			for _, r := range s.pending {
				answer(r, nil, err)
			}
			clear(s.pending)
			s.pending = s.pending[:0]
			s.mu.Unlock()
			continue
		}
		flight, skipped := pickFlight(s.pending)
		streams := make([]string, 0, 2*len(flight))
		count, end := flight[0].count, flight[0].deadline
		for _, r := range flight {
			streams = append(streams, r.stream)
			count = min(count, r.count)
			if r.deadline.Before(end) {
				end = r.deadline
			}
		}
		for range flight {
			streams = append(streams, ">")
		}
		block := max(time.Until(end), time.Millisecond)
		if s.members > 1 && !s.unblockable.Load() {
			block = min(block, sharedFallbackBlock)
		}
		if skipped {
			block = -1 // no BLOCK: the requests left out are read next
		}
		s.flight, s.end, s.stale = flight, time.Now().Add(block), false
		s.mu.Unlock()

		s.reads.Add(1)
		res, err := reader.read(ctx, &redis.XReadGroupArgs{Group: s.group, Consumer: s.consumer, Streams: streams, Count: count, Block: block})
		if err != nil && !errors.Is(err, redis.Nil) && !isReplyError(err, "NOGROUP", "UNBLOCKED") {
			s.drop() // MOVED, ASK, a failed connection: resolve the node again
		}

		s.mu.Lock()
		s.flight = nil
		now := time.Now()
		done := make(map[*readReq]bool, len(flight))
		switch {
		case err == nil || errors.Is(err, redis.Nil):
			retried = false
			got := make(map[string][]entry, len(res))
			for _, x := range res {
				got[x.stream] = x.entries
			}
			for _, r := range flight {
				if msgs := got[r.stream]; len(msgs) > 0 {
					answer(r, []streamRead{{stream: r.stream, entries: msgs}}, nil)
					done[r] = true
				} else if r.cancelled || !now.Before(r.deadline) {
					answer(r, nil, redis.Nil)
					done[r] = true
				}
			}
		case namedStream(err, flight) != nil:
			// NOGROUP for one stream (deleted, or its group destroyed):
			// that queue recreates its group, the others read on.
			retried = false
			r := namedStream(err, flight)
			answer(r, nil, err)
			done[r] = true
		case !retried && isReplyError(err, "NOGROUP", "UNBLOCKED"):
			// A stream deleted or a group destroyed under the blocked read:
			// the reply names no stream; the next read's NOGROUP will.
			retried = true
		default:
			retried = false
			for _, r := range flight {
				answer(r, nil, err)
				done[r] = true
			}
		}
		keep = s.pending[:0]
		for _, r := range s.pending {
			if !done[r] {
				keep = append(keep, r)
			}
		}
		clear(s.pending[len(keep):])
		s.pending = keep
		s.mu.Unlock()
	}
}

// resolve returns the reader for the group's node: on Cluster, a
// connection of the master that owns the group's slot now.
func (s *sharedReader) resolve(ctx context.Context, stream string) (*blockingReader, error) {
	s.mu.Lock()
	r := s.reader
	s.mu.Unlock()
	if r != nil {
		return r, nil
	}
	rdb := s.rdb
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, stream)
		if err != nil {
			return nil, err
		}
		rdb = node
	}
	r = newBlockingReader(rdb)
	s.mu.Lock()
	s.reader = r
	s.mu.Unlock()
	return r, nil
}

// drop forgets the reader's connection, so that the next read resolves the
// node again. Only the loop calls it.
func (s *sharedReader) drop() {
	s.mu.Lock()
	r := s.reader
	s.reader = nil
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
}

// interrupter ends a blocked read that is stale, with CLIENT UNBLOCK,
// retrying while the read has not blocked yet.
func (s *sharedReader) interrupter() {
	for {
		select {
		case <-s.kick:
		case <-s.stop:
			return
		}
		// Each attempt waits first: a read that finds entries returns
		// within it, and needs no CLIENT UNBLOCK (a backlog's reads would
		// otherwise cost one each).
		for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
			select {
			case <-time.After(wait):
			case <-s.stop:
				return
			}
			s.mu.Lock()
			r, needed := s.reader, s.flight != nil && s.stale
			s.mu.Unlock()
			if !needed || r == nil || !s.unblockable.Load() {
				break
			}
			ok, err := r.unblock()
			if err != nil {
				s.unblockable.Store(false)
				break
			}
			if ok {
				break
			}
		}
	}
}

// isReplyError reports whether err is a Redis error reply starting with
// one of the prefixes.
func isReplyError(err error, prefixes ...string) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range prefixes {
		if strings.HasPrefix(rerr.Error(), p) {
			return true
		}
	}
	return false
}

// namedStream returns the request whose stream a NOGROUP reply names
// ("NOGROUP No such key '<stream>' or consumer group '<group>' in
// XREADGROUP with GROUP option"), or nil.
func namedStream(err error, flight []*readReq) *readReq {
	if !isReplyError(err, "NOGROUP") {
		return nil
	}
	msg := err.Error()
	for _, r := range flight {
		if strings.Contains(msg, "No such key '"+r.stream+"' or consumer group") {
			return r
		}
	}
	return nil
}

// pickFlight returns the requests of pending that the next read serves, and
// whether some were left out. COUNT is one value for every stream of a
// read, and no queue may take more than its room, so a queue with little
// room would cut the batches of one with much: a request under half the
// largest room is left out of this read (which then must not block) and
// goes in the next one, whatever its room. So each queue is read at least
// every other read, and a queue with much room gets at least half of it.
// Call it with the reader's mu held.
func pickFlight(pending []*readReq) (flight []*readReq, skipped bool) {
	var most int64
	for _, r := range pending {
		most = max(most, r.count)
	}
	flight = make([]*readReq, 0, len(pending))
	for _, r := range pending {
		if r.count*2 >= most || r.skipped {
			r.skipped = false
			flight = append(flight, r)
		} else {
			r.skipped, skipped = true, true
		}
	}
	return flight, skipped
}
