package main

import (
	"os"
	"testing"
)

// TestRun runs the quickstart embedded (REDIS_URL unset) and against the
// test Redis at REDIS_ADDR, as a user would.
func TestRun(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		t.Setenv("REDIS_URL", "")
		if err := run(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		addr := os.Getenv("REDIS_ADDR")
		if addr == "" {
			addr = "127.0.0.1:6379"
		}
		t.Setenv("REDIS_URL", "redis://"+addr+"/0")
		if err := run(); err != nil {
			t.Fatalf("%v (is Redis running at REDIS_ADDR=%s?)", err, addr)
		}
	})
}
