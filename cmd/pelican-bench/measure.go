package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every job of every phase, floor and Pelican alike, carries the same
// payloadSize-byte JSON payload, which starts with its sequence number in
// the phase: {"n":000000042,...}. Handlers count distinct jobs by it, in a
// bitset, so that a 1,000,000-job drain costs 125 KB to check, not a map
// that would dwarf the RSS being measured.
const (
	payloadSize = 100
	seqStart    = len(`{"n":`)
	seqEnd      = seqStart + 9
)

var payloadTemplate = func() []byte {
	head := `{"n":000000000,"user":12345,"action":"noop","pad":"`
	tail := `"}`
	return []byte(head + strings.Repeat("x", payloadSize-len(head)-len(tail)) + tail)
}()

// payload returns a new payload for job seq (a new slice each time: a
// pipelined XADD keeps its arguments until the pipeline runs).
func payload(seq int) []byte {
	p := slices.Clone(payloadTemplate)
	for k := seqEnd - 1; k >= seqStart; k-- {
		p[k] = byte('0' + seq%10)
		seq /= 10
	}
	return p
}

// seqOf returns the sequence number in a payload.
func seqOf[T string | []byte](p T) (int, bool) {
	if len(p) < seqEnd {
		return 0, false
	}
	n := 0
	for k := seqStart; k < seqEnd; k++ {
		c := p[k]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// jobSet counts the runs of a phase's handler and the distinct jobs they
// ran, by the sequence number in their payload; with job IDs, it also
// checks that every run of a job had the ID of its first run, so that the
// distinct jobs are distinct job IDs. It is safe for concurrent use.
type jobSet struct {
	n        int
	words    []uint64
	ids      []atomic.Pointer[string] // nil: no job IDs (the floor, the RSS drain)
	runs     atomic.Int64
	distinct atomic.Int64
	bad      atomic.Int64 // payloads without a sequence number in [0, n)
	otherID  atomic.Int64 // runs whose job ID differed from the first run's
}

func newJobSet(n int) *jobSet { return &jobSet{n: n, words: make([]uint64, (n+63)/64)} }

// withIDs makes s check job IDs. It costs an allocation per run and 24
// bytes per job, so both sides of a phase use it or neither does.
func (s *jobSet) withIDs() *jobSet {
	s.ids = make([]atomic.Pointer[string], s.n)
	return s
}

// see records a run of the job whose payload is p and reports whether it is
// the job's first run.
func see[T string | []byte](s *jobSet, p T) bool { return seeJob(s, p, "") }

// seeJob is see for a job with an ID.
func seeJob[T string | []byte](s *jobSet, p T, id string) bool {
	s.runs.Add(1)
	seq, ok := seqOf(p)
	if !ok || seq >= s.n {
		s.bad.Add(1)
		return false
	}
	if s.ids != nil && !s.ids[seq].CompareAndSwap(nil, &id) && *s.ids[seq].Load() != id {
		s.otherID.Add(1)
	}
	bit := uint64(1) << (seq % 64)
	if atomic.OrUint64(&s.words[seq/64], bit)&bit != 0 {
		return false
	}
	s.distinct.Add(1)
	return true
}

// check returns an error unless exactly s.n distinct jobs ran, in runs
// runs, each with one job ID.
func (s *jobSet) check(runs int) error {
	d, r, bad, other := s.distinct.Load(), s.runs.Load(), s.bad.Load(), s.otherID.Load()
	if d != int64(s.n) || r != int64(runs) || bad != 0 || other != 0 {
		return fmt.Errorf("%d distinct jobs ran in %d runs (%d without a valid sequence number, %d with another job ID than their first run); want exactly %d in %d runs",
			d, r, bad, other, s.n, runs)
	}
	return nil
}

// result is one measured run of one side of one phase.
type result struct {
	jobs     int
	elapsed  time.Duration
	cpu      time.Duration // this process (rusage) + the Redis server (INFO cpu)
	redisCPU time.Duration // the Redis server's part of cpu
	allocs   uint64
	p50, p99 time.Duration // latency phases only
}

func (r result) rate() float64 { return float64(r.jobs) / r.elapsed.Seconds() }

// cpuPerJob returns CPU µs per job.
func (r result) cpuPerJob() float64 { return float64(r.cpu.Nanoseconds()) / 1e3 / float64(r.jobs) }

// redisPerJob returns the Redis server's CPU µs per job, the part of
// cpuPerJob that Redis spent.
func (r result) redisPerJob() float64 {
	return float64(r.redisCPU.Nanoseconds()) / 1e3 / float64(r.jobs)
}

// clientPerJob returns this process's CPU µs per job, the rest of
// cpuPerJob.
func (r result) clientPerJob() float64 { return r.cpuPerJob() - r.redisPerJob() }

func (r result) allocsPerJob() float64 { return float64(r.allocs) / float64(r.jobs) }

// meter measures wall time, CPU (this process and Redis) and allocations
// between start and stop, and profiles the run when the bench asks for it.
type meter struct {
	b       *bench
	t0      time.Time
	cpu0    time.Duration
	redis0  time.Duration
	mallocs uint64
}

func (b *bench) startMeter(ctx context.Context) *meter {
	runtime.GC() // the garbage of the fill is not the phase's
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &meter{b: b, mallocs: ms.Mallocs}
	m.redis0 = redisCPU(ctx, b.rdb)
	m.cpu0 = m.redis0 + processCPU()
	b.startProfile()
	m.t0 = time.Now()
	return m
}

func (m *meter) stop(ctx context.Context, jobs int) result {
	elapsed := time.Since(m.t0)
	m.b.stopProfile()
	rcpu := redisCPU(ctx, m.b.rdb)
	cpu := processCPU() + rcpu - m.cpu0
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return result{jobs: jobs, elapsed: elapsed, cpu: cpu, redisCPU: rcpu - m.redis0, allocs: ms.Mallocs - m.mallocs}
}

// profileReq is a request to profile the next measured run.
type profileReq struct {
	cpu, mem string
	cpuFile  *os.File
	// stats: snapshot INFO commandstats around the run.
	stats                   bool
	statsBefore, statsAfter map[string]cmdStat
}

func (b *bench) startProfile() {
	p := b.prof
	if p == nil {
		return
	}
	if p.mem != "" {
		writeHeapProfile(b, p.mem+".base")
	}
	if p.stats {
		p.statsBefore = commandStats(b)
	}
	if p.cpu != "" {
		f, err := os.Create(p.cpu)
		if err != nil {
			b.fatalf("cpuprofile: %v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.fatalf("cpuprofile: %v", err)
		}
		p.cpuFile = f
	}
}

func (b *bench) stopProfile() {
	p := b.prof
	if p == nil {
		return
	}
	if p.cpuFile != nil {
		pprof.StopCPUProfile()
		p.cpuFile.Close()
		p.cpuFile = nil
	}
	if p.mem != "" {
		writeHeapProfile(b, p.mem)
	}
	if p.stats {
		p.statsAfter = commandStats(b)
	}
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64
}

// commandStats returns the Redis server's INFO commandstats, by command.
func commandStats(b *bench) map[string]cmdStat {
	info, err := b.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.fatalf("INFO commandstats: %v", err)
	}
	return parseCommandStats(info)
}

// parseCommandStats parses the lines "cmdstat_NAME:calls=N,usec=N,..." of
// INFO commandstats.
func parseCommandStats(info string) map[string]cmdStat {
	out := map[string]cmdStat{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_")), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		var st cmdStat
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[name] = st
	}
	return out
}

// printCommandStats prints what Redis ran between before and after, per job
// of a run of jobs jobs, most time first. The time of a script (EVALSHA)
// includes the commands it ran, which are also counted on their own lines.
// Redis counts every client's commands: on a shared server, others' too.
func printCommandStats(before, after map[string]cmdStat, jobs int) {
	type line struct {
		name string
		d    cmdStat
	}
	var lines []line
	for name, a := range after {
		d := cmdStat{a.calls - before[name].calls, a.usec - before[name].usec}
		if d.calls > 0 {
			lines = append(lines, line{name, d})
		}
	}
	slices.SortFunc(lines, func(x, y line) int { return cmp.Compare(y.d.usec, x.d.usec) })
	fmt.Printf("\nRedis commands of that run (INFO commandstats; a script's time includes the commands it ran, also listed):\n\n")
	fmt.Println("| command | calls | calls/job | µs/call | µs/job |\n|---|---|---|---|---|")
	for _, l := range lines {
		fmt.Printf("| %s | %d | %.3f | %.2f | %.3f |\n", l.name, l.d.calls, float64(l.d.calls)/float64(jobs),
			float64(l.d.usec)/float64(l.d.calls), float64(l.d.usec)/float64(jobs))
	}
}

func writeHeapProfile(b *bench, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.fatalf("memprofile: %v", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		b.fatalf("memprofile: %v", err)
	}
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
	f, _ := strconv.ParseFloat(infoField(ctx, rdb, section, key), 64)
	return f
}

func infoField(ctx context.Context, rdb *redis.Client, section, key string) string {
	info, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v
		}
	}
	return ""
}

// procStatusKiB returns a "kB" field of /proc/self/status (VmHWM, VmRSS).
func procStatusKiB(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// waitFor polls cond (in-process counters, never Redis) every millisecond
// until it holds, and fails the bench with describe() after the phase
// timeout.
func (b *bench) waitFor(what string, cond func() bool, describe func() string) {
	deadline := time.Now().Add(b.phaseTimeout())
	for !cond() {
		if time.Now().After(deadline) {
			b.fatalf("%s: not done after %v: %s", what, b.phaseTimeout(), describe())
		}
		time.Sleep(time.Millisecond)
	}
}

// phaseTimeout bounds one run: generous, a run this slow is broken.
func (b *bench) phaseTimeout() time.Duration {
	return 5*time.Minute + time.Duration(b.n)*2*time.Millisecond
}

// deleteMatching deletes the keys matching each SCAN pattern.
func (b *bench) deleteMatching(ctx context.Context, patterns ...string) {
	for _, p := range patterns {
		iter := b.rdb.Scan(ctx, 0, p, 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 500 {
				b.rdb.Unlink(ctx, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			b.rdb.Unlink(ctx, batch...)
		}
	}
}

// streamOf returns the stream of a run: every key of the run's queue shares
// the hash tag {tag}, whatever suffix the library gives it.
func streamOf(tag string) string { return "{" + tag + "}:jobs" }

// cleanupRun deletes every key of a run: its queue's keys ({tag}...,
// where per-queue middleware keys live too) and the keys under the run's
// own middleware prefixes (tag:lock:, tag:idem:).
func (b *bench) cleanupRun(ctx context.Context, tag string) {
	b.deleteMatching(ctx, "{"+tag+"}*", tag+":*")
}

// cleanupAll deletes every key of this bench process.
func (b *bench) cleanupAll(ctx context.Context) {
	b.deleteMatching(ctx, "{bench:"+b.runID+":*", "bench:"+b.runID+":*")
}

// fatalf prints the error, deletes the bench's keys and exits 1.
func (b *bench) fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pelican-bench: FAILED: "+format+"\n", args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	b.cleanupAll(ctx)
	cancel()
	os.Exit(1)
}
