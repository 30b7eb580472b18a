package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// retention runs n jobs through one queue with the default configuration
// (settled entries deleted by the consumers), the producer kept at most
// backlog jobs ahead, and prints the stream's length and Redis used_memory
// as it goes, so a reader sees whether both stay flat. Then it compares the
// consume phase with and without the deletion (Config.KeepSettled), in
// alternating rounds, with client and Redis CPU per job.
func (b *bench) retention(ctx context.Context, n, backlog, rounds int) {
	s := b.name("retention")
	defer b.cleanup(ctx, s)
	fmt.Printf("\nretention: %d jobs through one queue, default Config, producer at most %d jobs ahead\n", n, backlog)
	var done atomic.Int64
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: "g", Concurrency: b.concurrency, Logger: quiet()}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { done.Add(1); return nil }))
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()

	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s})
	start := time.Now()
	var maxLen, minMem, maxMem int64
	sample := func() {
		l := b.rdb.XLen(ctx, s).Val()
		m := usedMemory(ctx, b.rdb)
		maxLen = max(maxLen, l)
		if minMem == 0 || m < minMem {
			minMem = m
		}
		maxMem = max(maxMem, m)
		fmt.Printf("  %9d jobs done  %8.0fs  stream length %7d  used_memory %6.1f MB\n",
			done.Load(), time.Since(start).Seconds(), l, float64(m)/(1<<20))
	}
	next := time.Now()
	for sent := 0; sent < n; {
		if time.Now().After(next) {
			sample()
			next = time.Now().Add(10 * time.Second)
		}
		if int64(sent)-done.Load() > int64(backlog) {
			time.Sleep(time.Millisecond)
			continue
		}
		batch := make([]*stream.Job, min(100, n-sent))
		for i := range batch {
			batch[i] = &stream.Job{Type: "bench", Payload: b.payload}
		}
		if _, err := p.EnqueueBatch(ctx, batch); err != nil {
			log.Fatal(err)
		}
		sent += len(batch)
	}
	for done.Load() < int64(n) || c.Stats().Acked < uint64(n) {
		time.Sleep(10 * time.Millisecond)
	}
	sample()
	cancel()
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  %d jobs in %.0fs: stream length at most %d; used_memory between %.1f and %.1f MB\n",
		n, time.Since(start).Seconds(), maxLen, float64(minMem)/(1<<20), float64(maxMem)/(1<<20))

	fmt.Printf("\nconsume %d jobs: settled entries deleted (default) vs kept (KeepSettled), alternating\n", b.n)
	var del, keep []float64
	for r := 0; r < rounds; r++ {
		dr, dc := b.consumeSettled(ctx, false)
		kr, kc := b.consumeSettled(ctx, true)
		del, keep = append(del, dr), append(keep, kr)
		fmt.Printf("round %d: deleted %.0f jobs/s (%.1f µs CPU/job), kept %.0f jobs/s (%.1f µs CPU/job), ratio %.2f\n",
			r+1, dr, dc, kr, kc, dr/kr)
	}
	ratio := make([]float64, rounds)
	for i := range ratio {
		ratio[i] = del[i] / keep[i]
	}
	fmt.Printf("median ratio deleted/kept: %.2f\n", median(ratio))
}

// consumeSettled consumes a backlog of b.n jobs and returns jobs/s and CPU
// µs per job (this process plus Redis).
func (b *bench) consumeSettled(ctx context.Context, keep bool) (rate, cpuPerJob float64) {
	s := b.name("consume-settled")
	defer b.cleanup(ctx, s)
	b.pelicanFill(ctx, s)
	var wg sync.WaitGroup
	wg.Add(b.n)
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: "g", Concurrency: b.concurrency, Logger: quiet(), KeepSettled: keep}).
		Handle(consumer.HandlerFunc(func(context.Context, *stream.Job) error { wg.Done(); return nil }))
	runCtx, cancel := context.WithCancel(ctx)
	cpu0 := processCPU() + redisCPU(ctx, b.rdb)
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	wg.Wait()
	for c.Stats().Acked < uint64(b.n) {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu := processCPU() + redisCPU(ctx, b.rdb) - cpu0
	cancel()
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	if st := c.Stats(); st.Acked != uint64(b.n) {
		log.Fatalf("consume: %d acked, want %d", st.Acked, b.n)
	}
	left := b.rdb.XLen(ctx, s).Val()
	if !keep && left != 0 || keep && left != int64(b.n) {
		log.Fatalf("consume (keep %v): %d entries left in the stream", keep, left)
	}
	return float64(b.n) / elapsed.Seconds(), cpu.Seconds() * 1e6 / float64(b.n)
}

// processCPU returns this process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the Redis server's user + system CPU time (INFO cpu).
func redisCPU(ctx context.Context, rdb *redis.Client) time.Duration {
	var total float64
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		total += infoFloat(ctx, rdb, "cpu", k)
	}
	return time.Duration(total * float64(time.Second))
}

func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	return int64(infoFloat(ctx, rdb, "memory", "used_memory"))
}

func infoFloat(ctx context.Context, rdb *redis.Client, section, key string) float64 {
	info, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
