// Command pelican-bench measures Pelican against the raw go-redis floor on
// one Redis, side by side in one run, and prints both rates and their ratio.
//
//	go run ./cmd/pelican-bench [-addr 127.0.0.1:6379] [-jobs 200000] [-rounds 3]
//	go run ./cmd/pelican-bench -retention 10000000 [-backlog 100000]
//
// Floor: pipelined XADD in batches of 100; one loop of XREADGROUP COUNT 100
// with a no-op handler and a plain XACK per batch (not owner-checked).
// Pelican: Producer.EnqueueBatch in batches of 100; a bare consumer (no
// middleware, no-op handler) with owner-checked settlement. Then the
// enqueue-to-handler latency (p50, p99) at a steady rate. The machine is
// shared and noisy: compare the ratios, not the absolute rates.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address")
	jobs := flag.Int("jobs", 200000, "jobs per throughput phase")
	rate := flag.Int("rate", 2000, "jobs/s for the latency phase")
	latencyFor := flag.Duration("latency-for", 5*time.Second, "duration of the latency phase")
	concurrency := flag.Int("concurrency", 200, "Pelican consumer concurrency")
	rounds := flag.Int("rounds", 3, "rounds of floor and Pelican, alternating")
	policyJobs := flag.Int("policy-jobs", 50000, "jobs per failure-policy phase (0 skips them)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the Pelican consume phase to this file")
	memprofile := flag.String("memprofile", "", "write an allocation profile of the Pelican consume phase to this file")
	retention := flag.Int("retention", 0, "run only the retention phase: this many jobs through one queue, then the consume phase with settled entries deleted vs kept")
	backlog := flag.Int("backlog", 100000, "retention phase: how far the producer may run ahead of the consumer")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 32})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		log.Fatalf("redis at %s: %v", *addr, err)
	}
	b := &bench{rdb: rdb, n: *jobs, concurrency: *concurrency, cpuprofile: *cpuprofile, memprofile: *memprofile, payload: []byte(`{"user":12345,"action":"noop"}`)}

	fmt.Printf("pelican-bench: %d jobs per phase, Redis %s, GOMAXPROCS %d\n\n", *jobs, *addr, runtime.GOMAXPROCS(0))
	if *retention > 0 {
		b.retention(ctx, *retention, *backlog, *rounds)
		return
	}
	// Floor and Pelican alternate, round after round, so that a burst of
	// load from elsewhere on the machine hits both; the table shows medians.
	var floorProd, floorCons, pelProd, pelCons, floorAllocs, allocs []float64
	for r := 0; r < *rounds; r++ {
		floorProd = append(floorProd, b.floorProduce(ctx))
		pelProd = append(pelProd, b.pelicanProduce(ctx))
		fc, fa := b.floorConsume(ctx)
		pc, pa := b.pelicanConsume(ctx)
		floorCons, floorAllocs = append(floorCons, fc), append(floorAllocs, fa)
		pelCons, allocs = append(pelCons, pc), append(allocs, pa)
		fmt.Printf("round %d: enqueue %.0f vs %.0f (%.2f), consume %.0f vs %.0f (%.2f)\n",
			r+1, floorProd[r], pelProd[r], pelProd[r]/floorProd[r], fc, pc, pc/fc)
	}
	ratios := func(pel, floor []float64) float64 {
		r := make([]float64, len(pel))
		for i := range pel {
			r[i] = pel[i] / floor[i]
		}
		return median(r)
	}
	endToEnd := func(prod, cons []float64) []float64 {
		r := make([]float64, len(prod))
		for i := range prod {
			r[i] = 1 / (1/prod[i] + 1/cons[i])
		}
		return r
	}
	floorAll, pelAll := endToEnd(floorProd, floorCons), endToEnd(pelProd, pelCons)
	fmt.Printf("\nmedians of %d rounds (ratio: median of the rounds' ratios)\n%-10s %14s %14s %8s\n", *rounds, "phase", "floor jobs/s", "pelican jobs/s", "ratio")
	fmt.Printf("%-10s %14.0f %14.0f %8.2f\n", "enqueue", median(floorProd), median(pelProd), ratios(pelProd, floorProd))
	fmt.Printf("%-10s %14.0f %14.0f %8.2f\n", "consume", median(floorCons), median(pelCons), ratios(pelCons, floorCons))
	fmt.Printf("%-10s %14.0f %14.0f %8.2f\n", "end2end", median(floorAll), median(pelAll), ratios(pelAll, floorAll))
	fmt.Printf("\nallocations per consumed job: floor %.1f, pelican %.1f\n", median(floorAllocs), median(allocs))

	if *policyJobs > 0 {
		b.policyPhases(ctx, *policyJobs, b.extraPolicyPhases()...)
	}

	p50, p99, n := b.latency(ctx, *rate, *latencyFor)
	fmt.Printf("latency at %d jobs/s (%d jobs): enqueue-to-handler p50 %v, p99 %v\n", *rate, n, p50, p99)
}

type bench struct {
	rdb         *redis.Client
	n           int
	concurrency int
	cpuprofile  string
	memprofile  string
	payload     []byte
}

func (b *bench) name(kind string) string {
	s := fmt.Sprintf("bench:%s:%d", kind, time.Now().UnixNano())
	keys, _ := stream.KeysFor(s)
	return keys.Stream
}

func (b *bench) cleanup(ctx context.Context, s string) {
	keys, _ := stream.KeysFor(s)
	b.rdb.Del(ctx, keys.Stream, keys.Dead, keys.Delayed)
	// The queue's locks (their fence counters have no TTL) and idempotency
	// records, from the policy phases.
	b.deleteKeys(ctx, keys.Lock+"*", keys.Idem+"*")
}

func (b *bench) floorProduce(ctx context.Context) float64 {
	s := b.name("floor-produce")
	defer b.cleanup(ctx, s)
	start := time.Now()
	b.rawFill(ctx, s)
	return float64(b.n) / time.Since(start).Seconds()
}

// rawFill adds n entries with pipelined XADD in batches of 100.
func (b *bench) rawFill(ctx context.Context, s string) {
	for i := 0; i < b.n; i += 100 {
		pipe := b.rdb.Pipeline()
		for j := i; j < min(i+100, b.n); j++ {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "bench", "payload", b.payload}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			log.Fatal(err)
		}
	}
}

func (b *bench) floorConsume(ctx context.Context) (rate, allocsPerJob float64) {
	s := b.name("floor-consume")
	defer b.cleanup(ctx, s)
	b.rawFill(ctx, s)
	if err := b.rdb.XGroupCreate(ctx, s, "g", "0").Err(); err != nil {
		log.Fatal(err)
	}
	noop := func(redis.XMessage) {}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for done := 0; done < b.n; {
		res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{s, ">"}, Count: 100, Block: time.Second}).Result()
		if err != nil {
			log.Fatal(err)
		}
		msgs := res[0].Messages
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			noop(m)
			ids[i] = m.ID
		}
		if err := b.rdb.XAck(ctx, s, "g", ids...).Err(); err != nil {
			log.Fatal(err)
		}
		done += len(msgs)
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	return float64(b.n) / elapsed.Seconds(), float64(after.Mallocs-before.Mallocs) / float64(b.n)
}

func (b *bench) pelicanFill(ctx context.Context, s string) {
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s})
	batch := make([]*stream.Job, 0, 100)
	for i := 0; i < b.n; i++ {
		batch = append(batch, &stream.Job{Type: "bench", Payload: b.payload})
		if len(batch) == 100 || i == b.n-1 {
			if _, err := p.EnqueueBatch(ctx, batch); err != nil {
				log.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

func (b *bench) pelicanProduce(ctx context.Context) float64 {
	s := b.name("pelican-produce")
	defer b.cleanup(ctx, s)
	start := time.Now()
	b.pelicanFill(ctx, s)
	return float64(b.n) / time.Since(start).Seconds()
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (b *bench) pelicanConsume(ctx context.Context) (rate, allocsPerJob float64) {
	s := b.name("pelican-consume")
	defer b.cleanup(ctx, s)
	b.pelicanFill(ctx, s)
	var wg sync.WaitGroup
	wg.Add(b.n)
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: "g", Concurrency: b.concurrency, Logger: quiet()}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { wg.Done(); return nil }))
	runCtx, cancel := context.WithCancel(ctx)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if b.cpuprofile != "" {
		f, err := os.Create(b.cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	wg.Wait()
	for c.Stats().Acked < uint64(b.n) {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if b.memprofile != "" {
		f, err := os.Create(b.memprofile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			log.Fatal(err)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	if p, _ := b.rdb.XPending(ctx, s, "g").Result(); p == nil || p.Count != 0 {
		log.Fatalf("pelican consume: pending left: %+v", p)
	}
	return float64(b.n) / elapsed.Seconds(), float64(after.Mallocs-before.Mallocs) / float64(b.n)
}

// latency enqueues single jobs at a steady rate and measures the time from
// just before XADD to the handler's first line.
func (b *bench) latency(ctx context.Context, rate int, d time.Duration) (p50, p99 time.Duration, n int) {
	s := b.name("latency")
	defer b.cleanup(ctx, s)
	total := int(float64(rate) * d.Seconds())
	lat := make([]time.Duration, 0, total)
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(total)
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: "g", Concurrency: 50, StartID: "$", Logger: quiet()}).
		Handle(consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
			sent, _ := strconv.ParseInt(j.Headers["sent"], 10, 64)
			l := time.Since(time.Unix(0, sent))
			mu.Lock()
			lat = append(lat, l)
			mu.Unlock()
			wg.Done()
			return nil
		}))
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	// Wait until the group exists so no job is missed with StartID "$".
	for b.rdb.XInfoGroups(ctx, s).Err() != nil {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s})
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; i < total; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		j := &stream.Job{Type: "lat", Payload: b.payload, Headers: map[string]string{"sent": strconv.FormatInt(time.Now().UnixNano(), 10)}}
		if _, err := p.Enqueue(ctx, j); err != nil {
			log.Fatal(err)
		}
	}
	wg.Wait()
	cancel()
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], len(lat)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
