package consumer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

func TestVersionError(t *testing.T) {
	for _, c := range []struct {
		info string
		old  bool
	}{
		{"# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n", true},
		{"# Server\r\nredis_version:6.0.20\r\n", true},
		{"# Server\r\nredis_version:7.0.15\r\n", false},
		{"# Server\r\nredis_version:7.0.0\r\n", false},
		{"# Server\r\nredis_version:8.2.1\r\n", false},
		{"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.0\r\n", false},
		{"# Clients\r\nconnected_clients:1\r\n", false}, // says nothing: not refused
	} {
		err := versionError(c.info)
		if (err != nil) != c.old || (err != nil && !errors.Is(err, errVersion)) {
			t.Errorf("versionError(%q) = %v, want old=%v", c.info, err, c.old)
		}
	}
}

// A consumer started on a server that says it is Redis 6.2 returns at once
// with an error naming both versions, instead of waiting or running without
// what it needs. The server is a stand-in speaking the protocol (only Redis
// 7.0 runs on the test machines). Red check: without the version check in
// tryStart, Run fails later with "check permissions: ERR unknown command",
// which names neither version.
func TestRun_oldRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go fakeRedis62(conn)
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Protocol: 2})
	defer rdb.Close()
	c := New(rdb, Config{Stream: "s", Group: "g", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).
		Handle(HandlerFunc(func(context.Context, *stream.Job) error { return nil }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if err == nil || !errors.Is(err, errVersion) || !strings.Contains(err.Error(), "6.2.14") || !strings.Contains(err.Error(), MinRedisVersion) {
		t.Fatalf("Run on Redis 6.2 = %v, want the version error", err)
	}
}

// fakeRedis62 answers XGROUP CREATE with OK, INFO with a 6.2.14 server
// section, and everything else with an error.
func fakeRedis62(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "*") {
			return
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		var args []string
		for range n {
			hdr, err := r.ReadString('\n')
			if err != nil {
				return
			}
			l, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
			buf := make([]byte, l+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return
			}
			args = append(args, string(buf[:l]))
		}
		var reply string
		switch strings.ToUpper(args[0]) {
		case "XGROUP":
			reply = "+OK\r\n"
		case "INFO":
			body := "# Server\r\nredis_version:6.2.14\r\n"
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(body), body)
		default:
			reply = "-ERR unknown command\r\n"
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}
