// Command pelican-bench measures Pelican against the strongest plain
// go-redis consumer, the floor, on one Redis, side by side in one run. For
// every phase it reports jobs/s and CPU µs per job (this process's rusage
// plus the Redis server's INFO cpu delta, used_cpu_sys + used_cpu_user),
// split into the two (client / Redis), and the ratio of each to the floor's
// in the same round.
//
//	go run ./cmd/pelican-bench [-jobs 200000] [-rounds 3] [-concurrency 0,50] [-phases consume,full-chain]
//	go run ./cmd/pelican-bench -retention 10000000 [-backlog 100000]
//	go run ./cmd/pelican-bench -outbox 20000 [-outbox-relays 2] [-rate 500] [-latency-for 5s] [-pg-dsn DSN]
//
// The floor: one reader goroutine (XREADGROUP COUNT 100, blocking) feeding
// 50 worker goroutines through a buffered channel, and one acker goroutine
// sending XACK for whatever finished meanwhile, concurrently with the reads
// (not owner-checked: it is a floor, not a design); its producer is
// pipelined XADD in batches of 100. Pelican: Producer.EnqueueBatch in
// batches of 100, and a consumer at each -concurrency (0: the default
// Config, what a user gets).
//
// Phases (-phases, a comma list; all by default):
//
//	produce          enqueue -jobs jobs
//	produce-tracked  enqueue -jobs tracked jobs (ProducerConfig.Track), each index record checked
//	consume          consume a backlog of -jobs jobs
//	consume-tracked  consume a backlog of -jobs tracked jobs, each index record checked done
//	pool             consume a backlog of -jobs jobs spread over three streams in one consumer.Pool
//	                 (weights 6/3/1, the pool's Concurrency as the consumer's); the floor reads one stream
//	produce-consume  produce and consume together
//	mid-chain        consume through middleware/metrics, middleware.Retry, middleware.DeadLetter
//	full-chain       consume through tracing (1% sampled, no exporter), metrics, middleware.Lock
//	                 (a lock key per job), middleware.Idempotency (idem.RedisStore), Retry, DeadLetter
//	lock             consume through middleware.Lock alone (a lock key per job)
//	idem             consume through middleware.Idempotency alone (idem.RedisStore, a key per job)
//	retry-once       every job retried once (consumer.Retry(0, err) on its first attempt)
//	snooze-once      every job snoozed once (consumer.Snooze(0) on its first run)
//	latency          enqueue-to-handler p50/p99 at -rate jobs/s for -latency-for
//	rss              peak RSS (VmHWM of a child process) draining a -backlog-rss backlog
//
// With -cluster host:port,... it runs only the partitions phase: -jobs jobs
// enqueued then consumed through one stream and through -partitions (12)
// partitions of a queue on that Redis Cluster, one consumer per stream at
// the first -concurrency, alternating for -rounds, with each master's Redis
// CPU (INFO cpu deltas) per job and its share of the cluster's.
//
// Every job carries the same 100-byte payload. Each run checks that exactly
// the jobs enqueued ran, each as often as the phase intends (distinct jobs
// counted by the handler), and that the queue is empty after it, and fails
// loudly otherwise; it then deletes its keys (a SCAN of the run's hash tag
// and of its lock and idempotency prefixes).
//
// The floor and Pelican alternate within each round (floor first in odd
// rounds, Pelican first in even ones), so that a burst of load from
// elsewhere on the machine hits both; the tables show medians over rounds,
// the ratios are medians of the rounds' ratios. Redis CPU is the server's
// whole CPU: on a shared Redis, others' commands count too, on both sides.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// allPhases are the phases, in the order they run.
var allPhases = []string{"produce", "produce-tracked", "consume", "consume-tracked", "pool", "produce-consume", "mid-chain", "full-chain", "lock", "idem",
	"retry-once", "snooze-once", "latency", "rss"}

// pgDSN is the outbox phase's PostgreSQL (-pg-dsn).
var pgDSN string

type bench struct {
	rdb        *redis.Client
	addr       string
	pool       int
	runID      string
	n          int
	rate       int
	latencyFor time.Duration
	prof       *profileReq // profile the next measured run
	prefetch   int         // Config.Prefetch of the Pelican consumers (0: the default)
}

func main() {
	addr := flag.String("addr", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address")
	prefetch := flag.Int("prefetch", 0, "Config.Prefetch of the Pelican consumers (0: the default, Concurrency)")
	pool := flag.Int("pool", 0, "go-redis PoolSize (0: the go-redis default, 10 per GOMAXPROCS)")
	jobs := flag.Int("jobs", 200000, "jobs per run of a throughput phase")
	rounds := flag.Int("rounds", 3, "rounds of floor and Pelican, alternating")
	rate := flag.Int("rate", 2000, "jobs/s of the latency phase")
	latencyFor := flag.Duration("latency-for", 5*time.Second, "duration of each latency run")
	backlogRSS := flag.Int("backlog-rss", 1000000, "backlog drained by the rss phase (0 skips it)")
	concFlag := flag.String("concurrency", "0,50", "consumer concurrencies of the Pelican consume and latency phases (0: the default Config)")
	phasesFlag := flag.String("phases", strings.Join(allPhases, ","), "phases to run, a comma list of: "+strings.Join(allPhases, ", "))
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of one extra run of -profile-phase to this file")
	memprofile := flag.String("memprofile", "", "write allocation profiles (FILE.base before, FILE after) of one extra run of -profile-phase")
	cmdstats := flag.Bool("commandstats", false, "print the Redis commands (INFO commandstats: calls and µs per job) of one extra run of -profile-phase")
	profilePhase := flag.String("profile-phase", "", "the run to profile: a row key such as full-chain@default or consume@50, floor:KEY for the floor's side")
	retention := flag.Int("retention", 0, "run only the retention phase: this many jobs through one queue, then the consume phase with settled entries deleted vs kept")
	backlog := flag.Int("backlog", 100000, "retention phase: how far the producer may run ahead of the consumer")
	outboxJobs := flag.Int("outbox", 0, "run only the outbox phase: this many jobs a run, plain producer vs enqueue-once vs outbox relay, then commit-to-stream latency at -rate for -latency-for")
	outboxRelays := flag.Int("outbox-relays", 2, "outbox phase: relays running at once")
	partitions := flag.Int("partitions", 12, "partitions phase: the partition count")
	clusterAddrs := flag.String("cluster", "", "run only the partitions phase on the Redis Cluster at these comma-separated addresses: -jobs jobs through one stream vs -partitions partitions, Redis CPU per master")
	flag.StringVar(&pgDSN, "pg-dsn", envOr("PG_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "outbox phase: PostgreSQL connection string")
	flag.Parse()

	usage := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "pelican-bench: "+format+"\n", args...)
		os.Exit(2)
	}
	if *jobs <= 0 || *rounds <= 0 || *rate <= 0 || *latencyFor <= 0 || *backlogRSS < 0 || *pool < 0 || *retention < 0 || *backlog <= 0 {
		usage("-jobs, -rounds, -rate, -latency-for and -backlog must be positive; -backlog-rss, -pool and -retention not negative")
	}
	concs, err := parseConcurrency(*concFlag)
	if err != nil {
		usage("-concurrency: %v", err)
	}
	phases := map[string]bool{}
	for _, p := range strings.Split(*phasesFlag, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(allPhases, p) {
			usage("-phases: unknown phase %q (known: %s)", p, strings.Join(allPhases, ", "))
		}
		phases[p] = true
	}

	b := &bench{addr: *addr, pool: *pool, runID: fmt.Sprintf("%08x", rand.Uint32()), n: *jobs, rate: *rate, latencyFor: *latencyFor, prefetch: *prefetch}
	if id := os.Getenv(envRunID); id != "" {
		b.runID = id
	}
	rows := b.rows(phases, concs)
	var profRow *row
	profFloor := false
	if (*cpuprofile != "" || *memprofile != "" || *cmdstats) != (*profilePhase != "") {
		usage("-profile-phase goes with -cpuprofile, -memprofile or -commandstats")
	}
	if *profilePhase != "" {
		key, floor := strings.CutPrefix(*profilePhase, "floor:")
		for i := range rows {
			if rows[i].key == key {
				profRow, profFloor = &rows[i], floor
			}
		}
		if profRow == nil {
			var keys []string
			for _, r := range rows {
				keys = append(keys, r.key)
			}
			usage("-profile-phase: %q is none of the rows selected: %s", key, strings.Join(keys, ", "))
		}
	}

	if *clusterAddrs != "" {
		if *partitions < 2 || *partitions > stream.MaxPartitions {
			usage("-partitions must be between 2 and %d", stream.MaxPartitions)
		}
		partitionBench(context.Background(), strings.Split(*clusterAddrs, ","), *jobs, *partitions, concs[0], *rounds)
		return
	}
	b.rdb = redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *pool})
	defer b.rdb.Close()
	ctx := context.Background()
	if err := b.rdb.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "pelican-bench: redis at %s: %v\n", *addr, err)
		os.Exit(1)
	}
	if side := os.Getenv(envChild); side != "" {
		b.rssChild(ctx, side)
		return
	}
	go func() { // Ctrl-C: delete this run's keys before leaving
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		fmt.Fprintln(os.Stderr, "pelican-bench: interrupted, deleting the bench's keys")
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		b.cleanupAll(cctx)
		cancel()
		os.Exit(130)
	}()

	fmt.Printf("pelican-bench: Redis %s at %s, GOMAXPROCS %d, load average %s; keys under {bench:%s:...} and bench:%s:...\n",
		infoField(ctx, b.rdb, "server", "redis_version"), *addr, runtime.GOMAXPROCS(0), loadAverage(), b.runID, b.runID)
	if *retention > 0 {
		b.retention(ctx, *retention, *backlog, *rounds, concs[0])
		return
	}
	if *outboxJobs > 0 {
		b.outboxPhase(ctx, pgDSN, *outboxJobs, *rounds, max(1, *outboxRelays), *rate, *latencyFor)
		return
	}
	fmt.Printf("%s jobs a run, rounds: %d, floor and Pelican alternating; 100-byte payloads, no-op handlers\n",
		thousands(float64(*jobs)), *rounds)

	b.warmUp(ctx)
	res := make([][]pair, len(rows))
	for r := 1; r <= *rounds; r++ {
		fmt.Printf("\nround %d of %d (load average %s)\n", r, *rounds, loadAverage())
		for i, rw := range rows {
			var p pair
			floorTag, pelTag := b.tag(rw.key, strconv.Itoa(r), "floor"), b.tag(rw.key, strconv.Itoa(r), "pelican")
			if r%2 == 1 {
				p.floor, p.pel = rw.floor(ctx, floorTag), rw.pel(ctx, pelTag)
			} else {
				p.pel, p.floor = rw.pel(ctx, pelTag), rw.floor(ctx, floorTag)
			}
			res[i] = append(res[i], p)
			fmt.Println("  " + rw.roundLine(p))
		}
	}
	if len(rows) > 0 {
		fmt.Printf("\nmedians of %d rounds (ratios: medians of the rounds' ratios); load average %s\n\n", *rounds, loadAverage())
		printTables(rows, res, *rate)
	}

	if phases["rss"] && *backlogRSS > 0 {
		fmt.Printf("\ndraining a backlog of %s jobs in a child process (default Config)...\n", thousands(float64(*backlogRSS)))
		fl := b.rssRun(ctx, "floor", *backlogRSS)
		pe := b.rssRun(ctx, "pelican", *backlogRSS)
		fmt.Printf("\n| drain a %s-job backlog, child process | floor | Pelican (default Config) |\n|---|---|---|\n",
			thousands(float64(*backlogRSS)))
		fmt.Printf("| peak RSS (VmHWM) | %.1f MiB | %.1f MiB |\n", float64(fl.hwmKiB)/1024, float64(pe.hwmKiB)/1024)
		fmt.Printf("| RSS before draining | %.1f MiB | %.1f MiB |\n", float64(fl.startKiB)/1024, float64(pe.startKiB)/1024)
		fmt.Printf("| jobs/s | %s | %s |\n", thousands(fl.r.rate()), thousands(pe.r.rate()))
		fmt.Printf("| CPU µs/job (child + Redis) | %.1f | %.1f |\n", fl.r.cpuPerJob(), pe.r.cpuPerJob())
	}

	if profRow != nil {
		side, run := "pelican", profRow.pel
		if profFloor {
			side, run = "floor", profRow.floor
		}
		p := &profileReq{cpu: *cpuprofile, mem: *memprofile, stats: *cmdstats}
		b.prof = p
		r := run(ctx, b.tag(profRow.key, "profile", side))
		b.prof = nil
		fmt.Printf("\nprofiled one extra run of %s (%s): %s jobs/s, %.1f CPU µs/job (client %.1f / Redis %.1f; not in the tables)\n",
			profRow.key, side, thousands(r.rate()), r.cpuPerJob(), r.clientPerJob(), r.redisPerJob())
		if *cpuprofile != "" {
			fmt.Printf("  go tool pprof -top %s\n", *cpuprofile)
		}
		if *memprofile != "" {
			fmt.Printf("  go tool pprof -sample_index=alloc_space -top -base %s.base %s\n", *memprofile, *memprofile)
		}
		if *cmdstats {
			printCommandStats(p.statsBefore, p.statsAfter, r.jobs)
		}
	}
	b.cleanupAll(ctx)
}

// row is one line of the tables: a phase at one concurrency, measured on
// both sides.
type row struct {
	key     string // phase@concurrency, for -profile-phase
	phase   string
	label   string
	latency bool
	floor   func(ctx context.Context, tag string) result
	pel     func(ctx context.Context, tag string) result
}

// pair is one round of a row.
type pair struct{ floor, pel result }

// rows returns the rows of the selected phases.
func (b *bench) rows(phases map[string]bool, concs []int) []row {
	var rows []row
	add := func(r row) {
		if phases[r.phase] {
			rows = append(rows, r)
		}
	}
	add(row{key: "produce", phase: "produce", label: "produce (batches of 100)", floor: b.floorProduce, pel: b.pelicanProduce})
	add(row{key: "produce-tracked", phase: "produce-tracked", label: "produce tracked jobs (batches of 100)", floor: b.floorProduce,
		pel: func(ctx context.Context, tag string) result { return b.pelicanProduceTracked(ctx, tag, true) }})
	for _, spec := range []struct {
		phase, label string
		v            variant
	}{
		{"consume", "consume a backlog", variant{}},
		{"consume-tracked", "consume a backlog of tracked jobs", variant{track: true}},
		{"pool", "consume a backlog from three streams in one Pool (weights 6/3/1)", variant{pool: true}},
		{"produce-consume", "produce + consume together", variant{produce: true}},
		{"mid-chain", "mid chain (metrics, Retry, DeadLetter)", variant{chain: "mid"}},
		{"full-chain", "full chain (tracing 1% sampled, metrics, Lock, Idempotency, Retry, DeadLetter)", variant{chain: "full"}},
		{"lock", "Lock alone (a lock key per job)", variant{chain: "lock"}},
		{"idem", "Idempotency alone (Redis store, a key per job)", variant{chain: "idem"}},
		{"retry-once", "every job retried once", variant{mode: retryOnce}},
		{"snooze-once", "every job snoozed once", variant{mode: snoozeOnce}},
	} {
		for _, c := range concs {
			v := spec.v
			v.conc = c
			add(row{key: spec.phase + "@" + concKey(c), phase: spec.phase, label: spec.label + ", " + concLabel(c),
				floor: func(ctx context.Context, tag string) result { return b.floorConsume(ctx, tag, v.produce) },
				pel:   func(ctx context.Context, tag string) result { return b.pelicanConsume(ctx, tag, v) }})
		}
	}
	for _, c := range concs {
		add(row{key: "latency@" + concKey(c), phase: "latency", label: concLabel(c), latency: true,
			floor: b.floorLatency,
			pel:   func(ctx context.Context, tag string) result { return b.pelicanLatency(ctx, tag, c) }})
	}
	return rows
}

// warmUp runs both producers once, unmeasured, so that the first measured
// run does not pay for dialing connections and growing the heap.
func (b *bench) warmUp(ctx context.Context) {
	saved := b.n
	b.n = min(b.n, 10000)
	b.floorProduce(ctx, b.tag("warm-up", "0", "floor"))
	b.pelicanProduce(ctx, b.tag("warm-up", "0", "pelican"))
	b.n = saved
}

// tag returns the hash tag of one run: every key of the run starts with
// {tag} or tag:.
func (b *bench) tag(key, round, side string) string {
	return fmt.Sprintf("bench:%s:%s:r%s:%s", b.runID, strings.ReplaceAll(key, "@", "-"), round, side)
}

func (rw row) roundLine(p pair) string {
	if rw.latency {
		return fmt.Sprintf("%-24s floor p50 %s p99 %s %5.1f µs/job (%s) | pelican p50 %s p99 %s %5.1f µs/job (%s) | p99 ×%.2f, CPU ×%.2f",
			rw.key, fmtDur(p.floor.p50), fmtDur(p.floor.p99), p.floor.cpuPerJob(), split(p.floor),
			fmtDur(p.pel.p50), fmtDur(p.pel.p99), p.pel.cpuPerJob(), split(p.pel),
			ratio(p.pel.p99.Seconds(), p.floor.p99.Seconds()), ratio(p.pel.cpuPerJob(), p.floor.cpuPerJob()))
	}
	return fmt.Sprintf("%-24s floor %9s jobs/s %5.1f µs/job (%s) %4.1f allocs/job | pelican %9s jobs/s %5.1f µs/job (%s) %4.1f allocs/job | ratio %.2f, CPU ×%.2f",
		rw.key, thousands(p.floor.rate()), p.floor.cpuPerJob(), split(p.floor), p.floor.allocsPerJob(),
		thousands(p.pel.rate()), p.pel.cpuPerJob(), split(p.pel), p.pel.allocsPerJob(),
		ratio(p.pel.rate(), p.floor.rate()), ratio(p.pel.cpuPerJob(), p.floor.cpuPerJob()))
}

// split formats the client and Redis parts of a run's CPU µs/job,
// "client / Redis".
func split(r result) string {
	return fmt.Sprintf("%.1f / %.1f", r.clientPerJob(), r.redisPerJob())
}

// printTables prints the medians as markdown tables; the CPU columns
// "client / Redis" split CPU µs/job into this process's and the Redis
// server's, each the median over rounds.
func printTables(rows []row, res [][]pair, rate int) {
	col := func(ps []pair, f func(pair) float64) float64 {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = f(p)
		}
		return median(xs)
	}
	var through, lat []int
	for i, rw := range rows {
		if rw.latency {
			lat = append(lat, i)
		} else {
			through = append(through, i)
		}
	}
	if len(through) > 0 {
		fmt.Println("| phase | floor jobs/s | Pelican jobs/s | ratio | floor CPU µs/job | Pelican CPU µs/job | CPU ratio | floor client / Redis µs/job | Pelican client / Redis µs/job |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|")
		for _, i := range through {
			ps := res[i]
			fmt.Printf("| %s | %s | %s | %.2f | %.1f | %.1f | %.2f | %s | %s |\n", rows[i].label,
				thousands(col(ps, func(p pair) float64 { return p.floor.rate() })),
				thousands(col(ps, func(p pair) float64 { return p.pel.rate() })),
				col(ps, func(p pair) float64 { return ratio(p.pel.rate(), p.floor.rate()) }),
				col(ps, func(p pair) float64 { return p.floor.cpuPerJob() }),
				col(ps, func(p pair) float64 { return p.pel.cpuPerJob() }),
				col(ps, func(p pair) float64 { return ratio(p.pel.cpuPerJob(), p.floor.cpuPerJob()) }),
				splitCol(ps, func(p pair) result { return p.floor }),
				splitCol(ps, func(p pair) result { return p.pel }))
		}
		// The retried, snoozed and tracked phases against the bare ones
		// (the same concurrency), round by round.
		byKey := map[string][]pair{}
		for i, rw := range rows {
			byKey[rw.key] = res[i]
		}
		for _, i := range through {
			rw := rows[i]
			var bare []pair
			switch rw.phase {
			case "retry-once", "snooze-once", "consume-tracked":
				bare = byKey["consume@"+strings.TrimPrefix(rw.key, rw.phase+"@")]
			case "produce-tracked":
				bare = byKey["produce"]
			default:
				continue
			}
			if len(bare) != len(res[i]) {
				continue
			}
			xs, cs := make([]float64, len(bare)), make([]float64, len(bare))
			for r := range bare {
				xs[r] = ratio(res[i][r].pel.rate(), bare[r].pel.rate())
				cs[r] = ratio(res[i][r].pel.cpuPerJob(), bare[r].pel.cpuPerJob())
			}
			fmt.Printf("\n%s: Pelican jobs/s ÷ the bare phase's at the same concurrency: %.2f; CPU µs/job ×%.2f", rw.label, median(xs), median(cs))
		}
		fmt.Println()
	}
	if len(lat) > 0 {
		fmt.Printf("\n| enqueue-to-handler at %s jobs/s | floor p50 | floor p99 | Pelican p50 | Pelican p99 | p99 ratio | floor CPU µs/job | Pelican CPU µs/job | CPU ratio | floor client / Redis µs/job | Pelican client / Redis µs/job |\n",
			thousands(float64(rate)))
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
		dur := func(ps []pair, f func(pair) time.Duration) string {
			return fmtDur(time.Duration(col(ps, func(p pair) float64 { return float64(f(p)) })))
		}
		for _, i := range lat {
			ps := res[i]
			fmt.Printf("| %s | %s | %s | %s | %s | %.2f | %.1f | %.1f | %.2f | %s | %s |\n", rows[i].label,
				dur(ps, func(p pair) time.Duration { return p.floor.p50 }),
				dur(ps, func(p pair) time.Duration { return p.floor.p99 }),
				dur(ps, func(p pair) time.Duration { return p.pel.p50 }),
				dur(ps, func(p pair) time.Duration { return p.pel.p99 }),
				col(ps, func(p pair) float64 { return ratio(p.pel.p99.Seconds(), p.floor.p99.Seconds()) }),
				col(ps, func(p pair) float64 { return p.floor.cpuPerJob() }),
				col(ps, func(p pair) float64 { return p.pel.cpuPerJob() }),
				col(ps, func(p pair) float64 { return ratio(p.pel.cpuPerJob(), p.floor.cpuPerJob()) }),
				splitCol(ps, func(p pair) result { return p.floor }),
				splitCol(ps, func(p pair) result { return p.pel }))
		}
	}
}

// splitCol formats the medians over rounds of one side's client and Redis
// CPU µs/job, "client / Redis".
func splitCol(ps []pair, side func(pair) result) string {
	cl, rd := make([]float64, len(ps)), make([]float64, len(ps))
	for i, p := range ps {
		cl[i], rd[i] = side(p).clientPerJob(), side(p).redisPerJob()
	}
	return fmt.Sprintf("%.1f / %.1f", median(cl), median(rd))
}

// parseConcurrency parses -concurrency: a comma list of distinct
// concurrencies, 0 for the default Config.
func parseConcurrency(s string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 0 {
			return nil, fmt.Errorf("%q is not a concurrency (0 for the default Config, or a positive number)", f)
		}
		if slices.Contains(cs, c) {
			return nil, fmt.Errorf("%d given twice", c)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func concKey(c int) string {
	if c == 0 {
		return "default"
	}
	return strconv.Itoa(c)
}

func concLabel(c int) string {
	if c == 0 {
		return fmt.Sprintf("default Config (Concurrency %d)", consumer.DefaultConcurrency)
	}
	return fmt.Sprintf("Concurrency %d", c)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// thousands formats x rounded, with thousands separators.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func fmtDur(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d.Nanoseconds())/1e3)
	}
	return fmt.Sprintf("%.1f ms", float64(d.Nanoseconds())/1e6)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
