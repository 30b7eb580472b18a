package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// The RSS phase drains a backlog in a child process (this program run
// again with these variables set), so that its peak RSS (VmHWM) is the
// consumer's alone, not the parent's after every other phase.
const (
	envChild  = "PELICAN_BENCH_RSS_CHILD" // "floor" or "pelican"
	envStream = "PELICAN_BENCH_RSS_STREAM"
	envJobs   = "PELICAN_BENCH_RSS_JOBS"
	envRunID  = "PELICAN_BENCH_RUN_ID"
)

// rssResult is one drain of a backlog in a child process.
type rssResult struct {
	hwmKiB, startKiB int64 // VmHWM at the end, VmRSS before the consumer started
	r                result
}

// rssRun fills a backlog of n jobs and drains it in a child process with
// the floor or a Pelican consumer at the default Config.
func (b *bench) rssRun(ctx context.Context, side string, n int) rssResult {
	tag := fmt.Sprintf("bench:%s:rss:%s", b.runID, side)
	s := streamOf(tag)
	defer b.cleanupRun(ctx, tag)
	if side == "floor" {
		if err := b.rdb.XGroupCreateMkStream(ctx, s, floorGroup, "0").Err(); err != nil {
			b.fatalf("floor: %v", err)
		}
		b.floorFill(ctx, s, n)
	} else {
		b.pelicanFill(ctx, s, n)
	}
	exe, err := os.Executable()
	if err != nil {
		b.fatalf("rss: %v", err)
	}
	cmd := exec.CommandContext(ctx, exe, "-addr", b.addr, "-pool", strconv.Itoa(b.pool))
	cmd.Env = append(os.Environ(), envChild+"="+side, envStream+"="+s, envJobs+"="+strconv.Itoa(n), envRunID+"="+b.runID)
	cmd.Stderr = os.Stderr
	redis0 := redisCPU(ctx, b.rdb)
	out, err := cmd.Output()
	redisUsed := redisCPU(ctx, b.rdb) - redis0
	if err != nil {
		b.fatalf("rss %s child: %v", side, err)
	}
	var res rssResult
	var elapsed, cpu int64
	line := strings.TrimSpace(string(out))
	if _, err := fmt.Sscanf(line, "rss-child hwm_kib=%d start_kib=%d elapsed_ns=%d cpu_ns=%d",
		&res.hwmKiB, &res.startKiB, &elapsed, &cpu); err != nil {
		b.fatalf("rss %s child: unexpected output %q: %v", side, line, err)
	}
	res.r = result{jobs: n, elapsed: time.Duration(elapsed), cpu: time.Duration(cpu) + redisUsed}
	return res
}

// rssChild drains the backlog the parent filled and prints its peak RSS.
func (b *bench) rssChild(ctx context.Context, side string) {
	s := os.Getenv(envStream)
	n, err := strconv.Atoi(os.Getenv(envJobs))
	if err != nil || n <= 0 || s == "" {
		b.fatalf("rss child: bad %s or %s", envStream, envJobs)
	}
	b.n = n
	set := newJobSet(n)
	startKiB := procStatusKiB("VmRSS")
	t0, cpu0 := time.Now(), processCPU()
	var elapsed, cpu time.Duration
	switch side {
	case "floor":
		fc := b.startFloor(ctx, s, func(m redis.XMessage) {
			p, _ := m.Values["payload"].(string)
			see(set, p)
		})
		b.waitFor("rss floor", func() bool { return fc.acked.Load() >= int64(n) }, func() string { return "" })
		elapsed, cpu = time.Since(t0), processCPU()-cpu0
		fc.stop()
		b.checkFloor(ctx, "rss floor", s, set, n)
	case "pelican":
		c := consumer.New(b.rdb, consumer.Config{Stream: s, Group: pelicanGroup, Logger: quiet()}).
			Handle(consumer.HandlerFunc(func(_ context.Context, j *stream.Job) error {
				see(set, j.Payload)
				return nil
			}))
		runCtx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- c.Run(runCtx) }()
		b.waitFor("rss pelican", func() bool { return c.Stats().Acked >= uint64(n) }, func() string {
			return fmt.Sprintf("%+v", c.Stats())
		})
		elapsed, cpu = time.Since(t0), processCPU()-cpu0
		cancel()
		if err := <-errc; err != nil {
			b.fatalf("rss pelican: Run: %v", err)
		}
		b.checkPelican(ctx, "rss pelican", s, c.Stats(), set, n, plain)
	default:
		b.fatalf("rss child: unknown side %q", side)
	}
	fmt.Printf("rss-child hwm_kib=%d start_kib=%d elapsed_ns=%d cpu_ns=%d\n",
		procStatusKiB("VmHWM"), startKiB, elapsed.Nanoseconds(), cpu.Nanoseconds())
}
