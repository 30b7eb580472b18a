package integration

// Outside tests (issue 16) of consumer.Pool's shared reads with real
// processes: pool processes over three streams of one read group are
// SIGKILLed and SIGSTOPped; every job must end done, none lost, and a job
// runs twice only if the killed process had run it.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/consumer"
	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

func init() { subprocessModes["attack16shared"] = a16sPoolMain }

// a16sPoolMain runs a pool over A16S_STREAMS (comma-separated, weights
// 6/3/1), group g, consumer A16S_CONSUMER; each job sleeps 20 ms and then
// appends "done <stream> <payload> <consumer>" to A16S_LEDGER.
func a16sPoolMain() int {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("A16S_ADDR")})
	defer rdb.Close()
	ledger, err := os.OpenFile(os.Getenv("A16S_LEDGER"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ledger.Close()
	name := os.Getenv("A16S_CONSUMER")
	p := consumer.NewPool(rdb, consumer.PoolConfig{Concurrency: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for i, s := range strings.Split(os.Getenv("A16S_STREAMS"), ",") {
		s := s
		p.Add(consumer.Config{Stream: s, Group: "g", Consumer: name, Block: time.Second,
			VisibilityTimeout: 8 * time.Second, SweepInterval: time.Second},
			consumer.QueueOptions{Weight: []int{6, 3, 1}[i]}).
			Handle(consumer.HandlerFunc(func(ctx context.Context, job *stream.Job) error {
				time.Sleep(20 * time.Millisecond)
				_, err := fmt.Fprintf(ledger, "done %s %s %s\n", s, job.Payload, name)
				return err
			}))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		return 1
	}
	return 0
}

func TestAttack16Shared_processKillStop(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	name := redistest.Name(t)
	t.Cleanup(func() { redistest.DeleteKeys(rdb, name+"*") })
	ctx := context.Background()
	streams := []string{name + ":a", name + ":b", name + ":c"}
	ledger := t.TempDir() + "/ledger"
	env := func(cons string) []string {
		return []string{"A16S_ADDR=" + redistest.Addr(), "A16S_STREAMS=" + strings.Join(streams, ","),
			"A16S_CONSUMER=" + cons, "A16S_LEDGER=" + ledger}
	}
	const per = 150
	for _, s := range streams {
		pipe := rdb.Pipeline()
		for i := 0; i < per; i++ {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{"type", "t", "payload", fmt.Sprintf("j%d", i)}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	read := func() []string {
		b, _ := os.ReadFile(ledger)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	w1 := startSubprocess(t, "attack16shared", env("w1")...)
	w2 := startSubprocess(t, "attack16shared", env("w2")...)
	eventually(t, 120*time.Second, func() (bool, string) {
		n := len(read())
		return n >= 80, fmt.Sprintf("%d jobs done before the kill", n)
	})
	w1.kill()
	w2.stop()
	time.Sleep(1500 * time.Millisecond)
	w2.cont()
	w3 := startSubprocess(t, "attack16shared", env("w3")...)
	eventually(t, 180*time.Second, func() (bool, string) {
		for _, s := range streams {
			p, err := rdb.XPending(ctx, s, "g").Result()
			if err != nil || p.Count != 0 {
				return false, fmt.Sprintf("%s pending %v (%v)", s, p, err)
			}
			keys, _ := stream.KeysFor(s)
			if l, err := rdb.XLen(ctx, keys.Dead).Result(); err == nil && l > 0 {
				return false, fmt.Sprintf("%s has %d dead letters", s, l)
			}
		}
		seen := map[string]bool{}
		for _, l := range read() {
			f := strings.Fields(l)
			if len(f) == 4 {
				seen[f[1]+"/"+f[2]] = true
			}
		}
		return len(seen) == per*len(streams), fmt.Sprintf("%d of %d jobs done", len(seen), per*len(streams))
	})
	w2.term()
	w3.term()
	_ = w2.wait(60 * time.Second)
	_ = w3.wait(60 * time.Second)
	runs := map[string][]string{}
	for _, l := range read() {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		runs[f[1]+"/"+f[2]] = append(runs[f[1]+"/"+f[2]], f[3])
	}
	doubled, byW := 0, map[string]int{}
	for k, who := range runs {
		for _, w := range who {
			byW[w]++
		}
		if len(who) == 1 {
			continue
		}
		doubled++
		killed := 0
		for _, w := range who {
			if w == "w1" {
				killed++
			}
		}
		if len(who)-killed != 1 || killed != 1 {
			t.Errorf("%s ran %d times (%v): a second run is allowed only after one run in the killed process", k, len(who), who)
		}
	}
	for _, s := range streams {
		for i := 0; i < per; i++ {
			if len(runs[fmt.Sprintf("%s/j%d", s, i)]) == 0 {
				t.Errorf("%s j%d never done", s, i)
			}
		}
	}
	t.Logf("runs per process %v; %d jobs ran twice (each once in the SIGKILLed process)", byW, doubled)
}
