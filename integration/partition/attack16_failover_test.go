package partition

// Outside test (attack16): enqueue-once with retries across a master
// failover, through a PartitionedProducer, consumed by one consumer.Pool
// over every partition. One cluster for this file.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/poll"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// TestAttack16_onceRetryAcrossFailover: a producer with EnqueueOnce retries
// every job whose EnqueueBatch reported an error until it is acknowledged
// ("Retrying an Enqueue that failed is then safe") while the master of 4 of
// 12 partitions is SIGKILLed and replaced by its replica. Every job must
// end up acknowledged; a job of a surviving partition must run exactly
// once; on the dead master's partitions asynchronous replication may lose
// an acknowledged job or run one twice, counted apart and bounded.
func TestAttack16_onceRetryAcrossFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterReplicas(t, 3, 1)
	rdb := cl.Client(t, func(o *redis.ClusterOptions) {
		o.ClusterStateReloadInterval = time.Second
		o.PoolSize = 64
	})
	redis.SetLogger(quiet{})
	ctx := t.Context()
	queue := strings.ReplaceAll(redistest.Name(t), ":", "-")
	p, err := stream.NewPartitionedProducer(rdb, stream.PartitionedProducerConfig{Queue: queue, Partitions: 12,
		Producer: stream.ProducerConfig{EnqueueOnce: 10 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	streams := p.Streams()
	owner := mastersOf(t, ctx, rdb, cl, streams)
	onVictim := map[string]bool{}
	for i, s := range streams {
		if owner[i] == 0 {
			onVictim[s] = true
		}
	}
	victim := cl.Masters()[0]

	var mu sync.Mutex
	runs := map[string][]string{}
	pctx, stopPool := context.WithCancel(context.Background())
	pool := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 24, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, s := range streams {
		pool.Add(consumer.Config{Stream: s, Group: group, Consumer: "c1", VisibilityTimeout: 3 * time.Second,
			HeartbeatInterval: 750 * time.Millisecond, SweepInterval: 400 * time.Millisecond, Block: 300 * time.Millisecond},
			consumer.QueueOptions{}).Handle(consumer.HandlerFunc(func(ctx context.Context, j *stream.Job) error {
			mu.Lock()
			runs[j.ID] = append(runs[j.ID], j.Stream)
			mu.Unlock()
			return nil
		}))
	}
	poolDone := make(chan struct{})
	var poolErr error
	go func() { poolErr = pool.Run(pctx); close(poolDone) }()
	t.Cleanup(func() { stopPool(); <-poolDone })
	reading(t, ctx, rdb, streams, 1)

	const total = 3000
	acked := map[string]string{} // job id -> entry id
	var attempts, failedSurvivor int
	kill := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(40 * time.Second)
		for done := 0; done < total; done += 50 {
			var batch []*stream.Job
			for i := done; i < done+50; i++ {
				batch = append(batch, &stream.Job{ID: "job-" + strconv.Itoa(i), IdempotencyKey: "k-" + strconv.Itoa(i), Type: "t", Payload: []byte(`{}`)})
			}
			for len(batch) > 0 {
				if time.Now().After(deadline) {
					produced <- errors.New("jobs still not acknowledged 40 s on")
					return
				}
				attempts++
				ids, _ := p.EnqueueBatch(ctx, batch)
				var again []*stream.Job
				for i, j := range batch {
					if !strings.HasPrefix(j.ID, "job-") {
						produced <- errors.New("job ID changed to " + j.ID)
						return
					}
					if ids[i] == "" {
						if !onVictim[streams[p.Route(j)]] {
							failedSurvivor++
						}
						// the same job again: same ID and key
						again = append(again, &stream.Job{ID: j.ID, IdempotencyKey: j.IdempotencyKey, Type: "t", Payload: []byte(`{}`)})
						continue
					}
					acked[j.ID] = ids[i]
				}
				if batch = again; len(batch) > 0 {
					time.Sleep(50 * time.Millisecond) // a retry's backoff
				}
			}
			if done == total/3 {
				close(kill)
			}
			time.Sleep(10 * time.Millisecond) // spread the run over the failover
		}
		produced <- nil
	}()
	<-kill
	killedAt := time.Now()
	by := cl.KillMaster(victim)
	t.Logf("master killed, replica %s promoted after %v", by.Addr(), time.Since(killedAt).Round(time.Millisecond))
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	if len(acked) != total {
		t.Fatalf("%d of %d jobs acknowledged", len(acked), total)
	}
	// Wait until every acknowledged job ran, or nothing is left to run.
	poll.Until(t, 40*time.Second, func() (bool, string) {
		mu.Lock()
		ran := len(runs)
		mu.Unlock()
		if ran == total {
			return true, ""
		}
		var left int64
		for _, s := range streams {
			n, err1 := rdb.XLen(ctx, s).Result()
			pe, err2 := rdb.XPending(ctx, s, group).Result()
			if err1 != nil || err2 != nil {
				return false, "reading " + s
			}
			left += n + pe.Count
		}
		return left == 0, strconv.Itoa(ran) + " jobs ran, " + strconv.FormatInt(left, 10) + " entries left"
	})
	stopPool()
	<-poolDone
	if poolErr != nil && !errors.Is(poolErr, context.Canceled) {
		t.Errorf("pool: %v", poolErr)
	}
	var lostV, lostS, dupV, dupS, wrong int
	for id := range acked {
		s := streams[stream.PartitionOf("k-"+strings.TrimPrefix(id, "job-"), 12)]
		r := runs[id]
		for _, x := range r {
			if x != s {
				wrong++
			}
		}
		switch {
		case len(r) == 0 && onVictim[s]:
			lostV++
		case len(r) == 0:
			lostS++
		case len(r) > 1 && onVictim[s]:
			dupV++
		case len(r) > 1:
			dupS++
		}
	}
	t.Logf("%d batches sent (retries included), %d job errors on surviving partitions; dead master's partitions: %d lost, %d run twice; others: %d lost, %d run twice",
		attempts, failedSurvivor, lostV, dupV, lostS, dupS)
	if wrong != 0 {
		t.Errorf("%d runs from a partition other than the job's key's", wrong)
	}
	if lostS != 0 || dupS != 0 {
		t.Errorf("surviving partitions: %d acknowledged jobs never ran, %d ran twice", lostS, dupS)
	}
	if lostV > total/10 || dupV > total/4 {
		t.Errorf("dead master's partitions: %d lost, %d run twice: more than asynchronous replication explains", lostV, dupV)
	}
}
