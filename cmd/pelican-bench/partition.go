package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// partitionBench runs the same workload, n jobs enqueued in batches of 100
// and then consumed, through one stream and through a queue of parts
// partitions (stream.Partitions) on the Redis Cluster at addrs, rounds
// times alternating, and prints jobs/s and each master's Redis CPU (INFO
// cpu deltas) per phase. The single stream has one consumer at
// concurrency conc (0: the default), the partitions one consumer.Pool of
// conc slots (0: the default) over all of them.
func partitionBench(ctx context.Context, addrs []string, n, parts, conc, rounds int) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: max(64, 4*parts)})
	defer cc.Close()
	var masters []*redis.Client
	var mu sync.Mutex
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, redis.NewClient(&redis.Options{Addr: c.Options().Addr}))
		return nil
	}); err != nil {
		fmt.Fprintf(os.Stderr, "pelican-bench: cluster at %s: %v\n", strings.Join(addrs, ","), err)
		os.Exit(1)
	}
	for i := range masters { // a stable order: by address
		for j := i; j > 0 && masters[j].Options().Addr < masters[j-1].Options().Addr; j-- {
			masters[j], masters[j-1] = masters[j-1], masters[j]
		}
	}
	var names []string
	for _, m := range masters {
		names = append(names, m.Options().Addr)
	}
	fmt.Printf("pelican-bench: partitions: Redis Cluster with %d masters (%s), GOMAXPROCS %d, load average %s\n",
		len(masters), strings.Join(names, ", "), runtime.GOMAXPROCS(0), loadAverage())
	fmt.Printf("%d jobs a run (100-byte payloads, no-op handler), one stream (one consumer) vs %d partitions (one consumer.Pool), %s, %d rounds alternating\n",
		n, parts, concLabel(conc), rounds)

	type side struct {
		label string
		runs  []partitionRun
	}
	sides := []*side{{label: "1 stream"}, {label: fmt.Sprintf("%d partitions", parts)}}
	for r := 1; r <= rounds; r++ {
		order := []int{0, 1}
		if r%2 == 0 {
			order = []int{1, 0}
		}
		for _, k := range order {
			p := 1
			if k == 1 {
				p = parts
			}
			run := partitionRound(ctx, cc, masters, fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), r, k), n, p, conc)
			sides[k].runs = append(sides[k].runs, run)
			fmt.Printf("  round %d, %-14s %s\n", r, sides[k].label+":", run.line())
		}
	}
	fmt.Printf("\nmedians of %d rounds (load average %s)\n\n", rounds, loadAverage())
	fmt.Printf("| queue | produce jobs/s | consume jobs/s | Redis CPU µs/job, all nodes (produce + consume) | per-node share of Redis CPU, busiest first | spread (max−min)/mean |\n|---|---|---|---|---|---|\n")
	for _, s := range sides {
		var prod, cons, cpu, spread []float64
		shares := make([][]float64, len(masters))
		for _, run := range s.runs {
			prod = append(prod, run.produceRate)
			cons = append(cons, run.consumeRate)
			cpu = append(cpu, run.cpuPerJob())
			spread = append(spread, run.spread())
			for i, sh := range run.shares() {
				shares[i] = append(shares[i], sh)
			}
		}
		var sh []string
		for _, x := range shares {
			sh = append(sh, fmt.Sprintf("%.0f%%", 100*median(x)))
		}
		fmt.Printf("| %s | %s | %s | %.1f | %s | %.0f%% |\n", s.label, thousands(median(prod)), thousands(median(cons)),
			median(cpu), strings.Join(sh, " / "), 100*median(spread))
	}
}

// partitionRun is one run's figures.
type partitionRun struct {
	jobs                     int
	produceRate, consumeRate float64
	cpu                      []time.Duration // per master, produce + consume
}

func (r partitionRun) total() time.Duration {
	var t time.Duration
	for _, c := range r.cpu {
		t += c
	}
	return t
}

func (r partitionRun) cpuPerJob() float64 {
	return float64(r.total().Nanoseconds()) / 1e3 / float64(r.jobs)
}

// shares returns each master's share of the run's Redis CPU, busiest
// first (the single stream's master differs from run to run).
func (r partitionRun) shares() []float64 {
	out := make([]float64, len(r.cpu))
	for i, c := range r.cpu {
		out[i] = float64(c) / float64(max(r.total(), 1))
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// spread is (max − min) / mean of the masters' CPU.
func (r partitionRun) spread() float64 {
	lo, hi := r.cpu[0], r.cpu[0]
	for _, c := range r.cpu {
		lo, hi = min(lo, c), max(hi, c)
	}
	mean := float64(r.total()) / float64(len(r.cpu))
	return float64(hi-lo) / max(mean, 1)
}

func (r partitionRun) line() string {
	var per []string
	for _, c := range r.cpu {
		per = append(per, fmt.Sprintf("%.1f", float64(c.Nanoseconds())/1e3/float64(r.jobs)))
	}
	return fmt.Sprintf("produce %8s jobs/s  consume %8s jobs/s  Redis CPU µs/job per node %s (total %.1f, spread %.0f%%)",
		thousands(r.produceRate), thousands(r.consumeRate), strings.Join(per, " / "), r.cpuPerJob(), 100*r.spread())
}

func clusterCPU(ctx context.Context, masters []*redis.Client) []time.Duration {
	out := make([]time.Duration, len(masters))
	for i, m := range masters {
		out[i] = redisCPU(ctx, m)
	}
	return out
}

// partitionRound enqueues n jobs to queue's p partitions (p = 1: the plain
// stream "{queue}"), then consumes them with one consumer per stream, and
// checks that every job ran once and nothing is left.
func partitionRound(ctx context.Context, cc *redis.ClusterClient, masters []*redis.Client, queue string, n, p, conc int) partitionRun {
	streams := []string{"{" + queue + "}"}
	var enq func([]*stream.Job) error
	if p > 1 {
		pp, err := stream.NewPartitionedProducer(cc, stream.PartitionedProducerConfig{Queue: queue, Partitions: p})
		if err != nil {
			fatal("partitions: %v", err)
		}
		streams = pp.Streams()
		enq = func(jobs []*stream.Job) error { _, err := pp.EnqueueBatch(ctx, jobs); return err }
	} else {
		sp := stream.NewProducer(cc, stream.ProducerConfig{Stream: streams[0]})
		enq = func(jobs []*stream.Job) error { _, err := sp.EnqueueBatch(ctx, jobs); return err }
	}
	defer func() {
		for _, s := range streams {
			keys, _ := stream.KeysFor(s)
			cc.Del(ctx, s, keys.Dead, keys.Delayed)
		}
	}()
	before := clusterCPU(ctx, masters)
	start := time.Now()
	// Enqueue from 4 goroutines, batches of 100, as a few producers would.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				from := int(next.Add(100)) - 100
				if from >= n {
					return
				}
				batch := make([]*stream.Job, min(100, n-from))
				for i := range batch {
					batch[i] = &stream.Job{Type: "bench", Payload: payload(from + i)}
				}
				if err := enq(batch); err != nil {
					fatal("partitions: enqueue: %v", err)
				}
			}
		})
	}
	wg.Wait()
	run := partitionRun{jobs: n, produceRate: float64(n) / time.Since(start).Seconds()}

	seen := newJobSet(n)
	var done atomic.Int64
	h := consumer.HandlerFunc(func(_ context.Context, job *stream.Job) error {
		if see(seen, job.Payload) {
			done.Add(1)
		}
		return nil
	})
	runCtx, cancel := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	var idle []func(context.Context) error
	start = time.Now()
	if p == 1 {
		c := consumer.New(cc, consumer.Config{Stream: streams[0], Group: pelicanGroup, Concurrency: conc, Logger: quiet()}).Handle(h)
		idle = append(idle, c.WaitIdle)
		cwg.Go(func() {
			if err := c.Run(runCtx); err != nil {
				fatal("partitions: consumer %s: %v", streams[0], err)
			}
		})
	} else {
		// The partitions share one budget of conc slots, as one consumer's
		// Concurrency on the single stream.
		pool := consumer.NewPool(cc, consumer.PoolConfig{Concurrency: conc, Logger: quiet()})
		for _, s := range streams {
			q := pool.Add(consumer.Config{Stream: s, Group: pelicanGroup}, consumer.QueueOptions{Weight: 1}).Handle(h)
			idle = append(idle, q.WaitIdle)
		}
		cwg.Go(func() {
			if err := pool.Run(runCtx); err != nil {
				fatal("partitions: pool: %v", err)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Minute)
	for done.Load() < int64(n) {
		if time.Now().After(deadline) {
			fatal("partitions: %d of %d jobs ran within 10 minutes", done.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var iwg sync.WaitGroup // concurrently: each WaitIdle may wait for a read to end
	for _, wait := range idle {
		iwg.Go(func() {
			if err := wait(ctx); err != nil {
				fatal("partitions: %v", err)
			}
		})
	}
	iwg.Wait()
	run.consumeRate = float64(n) / time.Since(start).Seconds()
	after := clusterCPU(ctx, masters)
	cancel()
	cwg.Wait()
	for i := range after {
		run.cpu = append(run.cpu, after[i]-before[i])
	}
	if err := seen.check(n); err != nil {
		fatal("partitions: %v", err)
	}
	for _, s := range streams {
		if l := cc.XLen(ctx, s).Val(); l != 0 {
			fatal("partitions: %s holds %d entries after the run", s, l)
		}
	}
	return run
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pelican-bench: "+format+"\n", args...)
	os.Exit(1)
}
