package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRun runs the example on a free port, embedded and against the test
// Redis at REDIS_ADDR, and scrapes /metrics until the jobs are counted.
func TestRun(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		t.Setenv("REDIS_URL", "")
		scrape(t)
	})
	t.Run("redis", func(t *testing.T) {
		addr := os.Getenv("REDIS_ADDR")
		if addr == "" {
			addr = "127.0.0.1:6379"
		}
		t.Setenv("REDIS_URL", "redis://"+addr+"/0")
		scrape(t)
	})
}

func scrape(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v (is Redis running at REDIS_ADDR?)", err)
		}
	}()
	url := "http://" + ln.Addr().String() + "/metrics"
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^pelican_jobs_processed_total\{outcome="ack",stream="metrics-example:\d+",type="email.send"\} 3$`),
		regexp.MustCompile(`(?m)^pelican_jobs_processed_total\{outcome="retry",stream="metrics-example:\d+",type="email.send"\} 1$`),
		regexp.MustCompile(`(?m)^pelican_dead_letters_total\{reason="permanent",stream="metrics-example:\d+",type="report.build"\} 1$`),
		regexp.MustCompile(`(?m)^pelican_dead_letter_stream_length\{stream="metrics-example:\d+"\} 1$`),
		regexp.MustCompile(`(?m)^pelican_pending_jobs\{group="example",stream="metrics-example:\d+"\} 0$`),
		regexp.MustCompile(`(?m)^pelican_settled_total\{group="example",outcome="ack",stream="metrics-example:\d+"\} 3$`),
		regexp.MustCompile(`(?m)^pelican_collector_up 1$`),
		regexp.MustCompile(`(?m)^# TYPE pelican_job_duration_seconds histogram$`),
	}
	deadline := time.Now().Add(15 * time.Second)
	var body string
	for {
		body = get(t, url)
		missing := 0
		for _, re := range want {
			if !re.MatchString(body) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, re := range want {
				if !re.MatchString(body) {
					t.Errorf("/metrics has no line matching %s", re)
				}
			}
			t.Fatalf("last /metrics:\n%s", pelicanLines(body))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return "" // not serving yet
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

func pelicanLines(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "pelican_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
