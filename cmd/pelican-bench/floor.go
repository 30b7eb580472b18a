package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor is the strongest plain go-redis consumer: one reader
// (XREADGROUP COUNT 100, blocking) feeding floorWorkers goroutines through a
// buffered channel, and one acker sending XACK for whatever finished
// meanwhile, concurrently with the reads. Its acknowledgements are not
// owner-checked and it has no retries, leases or dead letters: it is a
// floor, not a design. Its producer is pipelined XADD in batches of 100.
const (
	floorWorkers = 50
	floorBatch   = 100
	floorGroup   = "g"
)

// floorFill adds jobs 0..n-1 with pipelined XADD in batches of 100, each
// entry the two fields a plain producer writes.
func (b *bench) floorFill(ctx context.Context, s string, n int) {
	for i := 0; i < n; i += floorBatch {
		cmds, err := b.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for j := i; j < min(i+floorBatch, n); j++ {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "bench", "payload", payload(j)}})
			}
			return nil
		})
		if err != nil {
			b.fatalf("floor XADD: %v (%d commands)", err, len(cmds))
		}
	}
}

// floorConsumer is a running floor consumer.
type floorConsumer struct {
	acked  atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFloor starts a floor consumer of s's group floorGroup (which must
// exist) that calls handle for each entry.
func (b *bench) startFloor(ctx context.Context, s string, handle func(redis.XMessage)) *floorConsumer {
	ctx, cancel := context.WithCancel(ctx)
	fc := &floorConsumer{cancel: cancel}
	work := make(chan redis.XMessage, floorBatch)
	finished := make(chan string, 1024)

	fc.wg.Add(1)
	go func() { // the reader
		defer fc.wg.Done()
		defer close(work)
		for ctx.Err() == nil {
			res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: floorGroup, Consumer: "floor",
				Streams: []string{s, ">"}, Count: floorBatch, Block: time.Second}).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				b.fatalf("floor XREADGROUP: %v", err)
			}
			for _, m := range res[0].Messages {
				select {
				case work <- m:
				case <-ctx.Done():
					return
				}
			}
		}
	}()

	var workers sync.WaitGroup
	for range floorWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for m := range work {
				handle(m)
				finished <- m.ID
			}
		}()
	}
	go func() { workers.Wait(); close(finished) }()

	fc.wg.Add(1)
	go func() { // the acker
		defer fc.wg.Done()
		ids := make([]string, 0, 1024)
		for id := range finished {
			ids = append(ids[:0], id)
		more:
			for len(ids) < cap(ids) {
				select {
				case id, ok := <-finished:
					if !ok {
						break more
					}
					ids = append(ids, id)
				default:
					break more
				}
			}
			if err := b.rdb.XAck(context.WithoutCancel(ctx), s, floorGroup, ids...).Err(); err != nil {
				b.fatalf("floor XACK: %v", err)
			}
			fc.acked.Add(int64(len(ids)))
		}
	}()
	return fc
}

// stop stops the consumer and waits for it (its blocked read returns
// within a second).
func (fc *floorConsumer) stop() {
	fc.cancel()
	fc.wg.Wait()
}

func (b *bench) floorProduce(ctx context.Context, tag string) result {
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	m := b.startMeter(ctx)
	b.floorFill(ctx, s, b.n)
	r := m.stop(ctx, b.n)
	if l := b.rdb.XLen(ctx, s).Val(); l != int64(b.n) {
		b.fatalf("floor produce: %d entries in the stream, want %d", l, b.n)
	}
	return r
}

// floorConsume consumes b.n jobs: a backlog, or (produce) jobs produced
// meanwhile.
func (b *bench) floorConsume(ctx context.Context, tag string, produce bool) result {
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	if err := b.rdb.XGroupCreateMkStream(ctx, s, floorGroup, "0").Err(); err != nil {
		b.fatalf("floor: %v", err)
	}
	if !produce {
		b.floorFill(ctx, s, b.n)
	}
	set := newJobSet(b.n).withIDs() // the entry ID as job ID: the same work as Pelican's side
	m := b.startMeter(ctx)
	fc := b.startFloor(ctx, s, func(msg redis.XMessage) {
		p, _ := msg.Values["payload"].(string)
		seeJob(set, p, msg.ID)
	})
	produced := make(chan struct{})
	if produce {
		go func() { b.floorFill(ctx, s, b.n); close(produced) }()
	} else {
		close(produced)
	}
	b.waitFor("floor consume", func() bool { return fc.acked.Load() >= int64(b.n) }, func() string {
		return strconv.FormatInt(fc.acked.Load(), 10) + " acked"
	})
	r := m.stop(ctx, b.n)
	<-produced
	fc.stop()
	b.checkFloor(ctx, "floor consume", s, set, b.n)
	return r
}

// checkFloor fails the bench unless exactly the set's jobs ran, runs
// times in all, and none is left pending.
func (b *bench) checkFloor(ctx context.Context, what, s string, set *jobSet, runs int) {
	if err := set.check(runs); err != nil {
		b.fatalf("%s: %v", what, err)
	}
	if p, err := b.rdb.XPending(ctx, s, floorGroup).Result(); err != nil || p.Count != 0 {
		b.fatalf("%s: pending left: %+v %v", what, p, err)
	}
}

// floorLatency measures the floor's enqueue-to-handler latency: single
// XADDs at the bench's rate.
func (b *bench) floorLatency(ctx context.Context, tag string) result {
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	if err := b.rdb.XGroupCreateMkStream(ctx, s, floorGroup, "0").Err(); err != nil {
		b.fatalf("floor: %v", err)
	}
	total := b.latencyJobs()
	set, lat := newJobSet(total+1).withIDs(), newLatencies(total)
	fc := b.startFloor(ctx, s, func(msg redis.XMessage) {
		p, _ := msg.Values["payload"].(string)
		sent, _ := msg.Values["sent"].(string)
		lat.record(p, sent)
		seeJob(set, p, msg.ID)
	})
	send := func(seq int) {
		err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "bench", "payload", payload(seq),
			"sent", strconv.FormatInt(time.Now().UnixNano(), 10)}}).Err()
		if err != nil {
			b.fatalf("floor XADD: %v", err)
		}
	}
	acked := func() int64 { return fc.acked.Load() }
	r := b.paced(ctx, "floor latency", total, send, acked)
	fc.stop()
	b.checkFloor(ctx, "floor latency", s, set, total+1)
	r.p50, r.p99 = lat.percentiles()
	return r
}
