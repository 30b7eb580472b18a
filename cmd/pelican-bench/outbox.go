package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for the outbox phase

	"github.com/pelicanqueue/pelican/outbox"
	"github.com/pelicanqueue/pelican/stream"
)

// outboxPhase compares, in alternating rounds, adding n jobs to a stream
// three ways: the plain producer (EnqueueBatch, batches of 100), the
// enqueue-once producer (the same, through the enqueue-once script keyed by
// job ID), and the outbox (n jobs committed in transactions of 100 first,
// then relayed by relays relays, timed from their start to the last job in
// the stream). Then commit-to-stream latency at rate jobs/s for d, one job
// per transaction: the outbox (relays woken by LISTEN) beside enqueueing
// right after the commit (not transactional: what the outbox replaces).
func (b *bench) outboxPhase(ctx context.Context, dsn string, n, rounds, relays, rate int, d time.Duration) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		b.fatalf("outbox: %v", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(relays + 4)
	if err := db.PingContext(ctx); err != nil {
		b.fatalf("outbox: PostgreSQL at -pg-dsn: %v", err)
	}
	table := "bench_outbox_" + b.runID
	if err := outbox.CreateSchema(ctx, db, table); err != nil {
		b.fatalf("%v", err)
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
	fmt.Printf("\noutbox: %s jobs a run, %d rounds, %d relays, PostgreSQL %s\n", thousands(float64(n)), rounds, relays, pgVersion(ctx, db))

	type three struct{ plain, once, relay float64 }
	var res []three
	for r := 1; r <= rounds; r++ {
		var t three
		runs := []func(){
			func() { t.plain = b.direct(ctx, fmt.Sprint(r), "plain", n, false) },
			func() { t.once = b.direct(ctx, fmt.Sprint(r), "once", n, true) },
			func() { t.relay = b.relayed(ctx, db, table, fmt.Sprint(r), n, relays) },
		}
		if r%2 == 0 {
			slices.Reverse(runs)
		}
		for _, f := range runs {
			f()
		}
		fmt.Printf("  round %d: plain %s jobs/s, enqueue-once %s jobs/s, outbox relay %s jobs/s (commit not counted)\n",
			r, thousands(t.plain), thousands(t.once), thousands(t.relay))
		res = append(res, t)
	}
	med := func(f func(three) float64) float64 {
		v := make([]float64, len(res))
		for i, x := range res {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Printf("\n| add %s jobs (medians of %d rounds) | jobs/s | ratio to plain |\n|---|---|---|\n", thousands(float64(n)), rounds)
	fmt.Printf("| plain producer, EnqueueBatch of 100 | %s | 1.00 |\n", thousands(med(func(x three) float64 { return x.plain })))
	fmt.Printf("| enqueue-once producer, EnqueueBatch of 100 | %s | %.2f |\n", thousands(med(func(x three) float64 { return x.once })),
		med(func(x three) float64 { return x.once / x.plain }))
	fmt.Printf("| outbox, %d relays draining committed rows | %s | %.2f |\n", relays, thousands(med(func(x three) float64 { return x.relay })),
		med(func(x three) float64 { return x.relay / x.plain }))

	total := max(1, int(float64(rate)*d.Seconds()))
	fmt.Printf("\ncommit-to-stream latency, %d jobs/s for %v, one job per transaction\n", rate, d)
	after50, after99 := b.commitLatency(ctx, db, table, "after-commit", total, rate, relays)
	box50, box99 := b.commitLatency(ctx, db, table, "outbox", total, rate, relays)
	fmt.Printf("\n| commit to stream | p50 | p99 |\n|---|---|---|\n")
	fmt.Printf("| Enqueue after the commit (not transactional) | %s | %s |\n", fmtDur(after50), fmtDur(after99))
	fmt.Printf("| outbox (LISTEN/NOTIFY, %d relays) | %s | %s |\n", relays, fmtDur(box50), fmtDur(box99))
}

func pgVersion(ctx context.Context, db *sql.DB) string {
	var v string
	_ = db.QueryRowContext(ctx, "SHOW server_version").Scan(&v)
	return v
}

// direct adds n jobs with a producer and returns jobs/s.
func (b *bench) direct(ctx context.Context, round, side string, n int, once bool) float64 {
	tag := b.tag("outbox", round, side)
	defer b.cleanupRun(ctx, tag)
	cfg := stream.ProducerConfig{Stream: streamOf(tag)}
	if once {
		cfg.EnqueueOnce, cfg.OnceKey = time.Hour, func(j *stream.Job) string { return "outbox:" + j.ID }
	}
	p := stream.NewProducer(b.rdb, cfg)
	start := time.Now()
	for sent := 0; sent < n; sent += 100 {
		batch := make([]*stream.Job, min(100, n-sent))
		for i := range batch {
			batch[i] = &stream.Job{Type: "bench", Payload: payload(sent + i)}
		}
		if _, err := p.EnqueueBatch(ctx, batch); err != nil {
			b.fatalf("outbox %s: %v", side, err)
		}
	}
	el := time.Since(start)
	if l := b.rdb.XLen(ctx, streamOf(tag)).Val(); l != int64(n) {
		b.fatalf("outbox %s: stream holds %d jobs, want %d", side, l, n)
	}
	return float64(n) / el.Seconds()
}

// relayed commits n jobs into the outbox, then times relays relays moving
// them all to the stream, and returns jobs/s.
func (b *bench) relayed(ctx context.Context, db *sql.DB, table, round string, n, relays int) float64 {
	tag := b.tag("outbox", round, "relay")
	defer b.cleanupRun(ctx, tag)
	s := streamOf(tag)
	w, err := outbox.NewWriter(outbox.WriterConfig{Stream: s, Table: table})
	if err != nil {
		b.fatalf("%v", err)
	}
	for sent := 0; sent < n; sent += 100 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.fatalf("outbox: %v", err)
		}
		for i := sent; i < min(sent+100, n); i++ {
			if err := w.Enqueue(ctx, tx, &stream.Job{Type: "bench", Payload: payload(i)}); err != nil {
				b.fatalf("%v", err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.fatalf("outbox: commit: %v", err)
		}
	}
	start := time.Now()
	stop := b.startRelays(ctx, db, table, relays, "")
	b.waitFor("outbox relay", func() bool { return b.rdb.XLen(ctx, s).Val() >= int64(n) },
		func() string { return fmt.Sprintf("%d of %d relayed", b.rdb.XLen(ctx, s).Val(), n) })
	el := time.Since(start)
	stop()
	if l := b.rdb.XLen(ctx, s).Val(); l != int64(n) {
		b.fatalf("outbox relay: stream holds %d jobs, want %d (a duplicate)", l, n)
	}
	return float64(n) / el.Seconds()
}

// startRelays runs relays relays (with LISTEN when dsn is set) until the
// returned stop is called.
func (b *bench) startRelays(ctx context.Context, db *sql.DB, table string, relays int, dsn string) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range relays {
		r, err := outbox.NewRelay(db, b.rdb, outbox.RelayConfig{Table: table, ListenDSN: dsn, Logger: quiet()})
		if err != nil {
			b.fatalf("%v", err)
		}
		wg.Go(func() { _ = r.Run(rctx) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// commitLatency commits total jobs at rate, one per transaction, each
// reaching the stream through the outbox (side "outbox") or by Enqueue
// right after its commit, and returns the p50 and p99 from the commit's
// return to the entry's ID time (both this machine's clock, ms).
func (b *bench) commitLatency(ctx context.Context, db *sql.DB, table, side string, total, rate, relays int) (p50, p99 time.Duration) {
	tag := b.tag("outbox-latency", "0", side)
	defer b.cleanupRun(ctx, tag)
	s := streamOf(tag)
	w, err := outbox.NewWriter(outbox.WriterConfig{Stream: s, Table: table})
	if err != nil {
		b.fatalf("%v", err)
	}
	p := stream.NewProducer(b.rdb, stream.ProducerConfig{Stream: s})
	if side == "outbox" {
		stop := b.startRelays(ctx, db, table, relays, pgDSN)
		defer stop()
	}
	committed := make(map[string]time.Time, total)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		job := &stream.Job{Type: "bench", Payload: payload(i)}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.fatalf("outbox: %v", err)
		}
		if side == "outbox" {
			if err := w.Enqueue(ctx, tx, job); err != nil {
				b.fatalf("%v", err)
			}
		} else if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil { // the transaction's own work
			b.fatalf("%v", err)
		}
		if err := tx.Commit(); err != nil {
			b.fatalf("outbox: commit: %v", err)
		}
		committed[fmt.Sprint(i)] = time.Now()
		if side != "outbox" {
			if _, err := p.Enqueue(ctx, job); err != nil {
				b.fatalf("%v", err)
			}
		}
	}
	b.waitFor("outbox latency", func() bool { return b.rdb.XLen(ctx, s).Val() >= int64(total) },
		func() string { return fmt.Sprintf("%d of %d in the stream", b.rdb.XLen(ctx, s).Val(), total) })
	msgs := b.rdb.XRange(ctx, s, "-", "+").Val()
	if len(msgs) != total {
		b.fatalf("outbox latency %s: stream holds %d jobs, want %d", side, len(msgs), total)
	}
	var d []time.Duration
	for i, m := range msgs {
		at, _ := stream.EntryTime(m.ID)
		seq, ok := seqOf(fmt.Sprint(m.Values[stream.FieldPayload]))
		c, found := committed[fmt.Sprint(seq)]
		if !ok || !found {
			b.fatalf("outbox latency: entry %d has no known sequence", i)
		}
		d = append(d, max(0, at.Sub(c.Truncate(time.Millisecond))))
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}
