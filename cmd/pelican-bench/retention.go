package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
)

// retention runs n jobs through one queue with settled entries deleted by
// the consumers (the default), the producer kept at most
// backlog jobs ahead, and prints the stream's length and Redis used_memory
// as it goes, so a reader sees whether both stay flat. Then it compares the
// consume phase with and without the deletion (Config.KeepSettled), in
// alternating rounds, with client and Redis CPU per job. Its consumers run
// at concurrency conc (0: the default Config).
func (b *bench) retention(ctx context.Context, n, backlog, rounds, conc int) {
	tag := b.tag("retention", "0", "pelican")
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	fmt.Printf("\nretention: %d jobs through one queue, %s, producer at most %d jobs ahead\n", n, concLabel(conc), backlog)
	var done atomic.Int64
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: pelicanGroup, Concurrency: conc, Logger: quiet()}).
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
			batch[i] = &stream.Job{Type: "bench", Payload: payload(sent + i)}
		}
		if _, err := p.EnqueueBatch(ctx, batch); err != nil {
			b.fatalf("retention: %v", err)
		}
		sent += len(batch)
	}
	for done.Load() < int64(n) || c.Stats().Acked < uint64(n) {
		time.Sleep(10 * time.Millisecond)
	}
	sample()
	cancel()
	if err := <-errc; err != nil {
		b.fatalf("retention: %v", err)
	}
	fmt.Printf("  %d jobs in %.0fs: stream length at most %d; used_memory between %.1f and %.1f MB\n",
		n, time.Since(start).Seconds(), maxLen, float64(minMem)/(1<<20), float64(maxMem)/(1<<20))

	fmt.Printf("\nconsume %d jobs: settled entries deleted (default) vs kept (KeepSettled), alternating\n", b.n)
	var del, keep []float64
	for r := 0; r < rounds; r++ {
		dr, dc := b.consumeSettled(ctx, conc, false, r)
		kr, kc := b.consumeSettled(ctx, conc, true, r)
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
func (b *bench) consumeSettled(ctx context.Context, conc int, keep bool, round int) (rate, cpuPerJob float64) {
	tag := b.tag("consume-settled-"+strconv.FormatBool(keep), strconv.Itoa(round), "pelican")
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	b.pelicanFill(ctx, s, b.n)
	var wg sync.WaitGroup
	wg.Add(b.n)
	c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: pelicanGroup, Concurrency: conc, Logger: quiet(), KeepSettled: keep}).
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
		b.fatalf("retention: %v", err)
	}
	if st := c.Stats(); st.Acked != uint64(b.n) {
		b.fatalf("consume: %d acked, want %d", st.Acked, b.n)
	}
	left := b.rdb.XLen(ctx, s).Val()
	if !keep && left != 0 || keep && left != int64(b.n) {
		b.fatalf("consume (keep %v): %d entries left in the stream", keep, left)
	}
	return float64(b.n) / elapsed.Seconds(), cpu.Seconds() * 1e6 / float64(b.n)
}
