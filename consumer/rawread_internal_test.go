package consumer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// rawEntry is one entry of a reply the tests write: fields nil for an entry
// deleted while pending.
type rawEntry struct {
	id     string
	fields []string // names and values, in turn
}

func bulk(b *strings.Builder, s string) {
	fmt.Fprintf(b, "$%d\r\n%s\r\n", len(s), s)
}

// encodeXRead writes the XREADGROUP reply for one stream's entries, as
// Redis does: RESP2 (an array) or RESP3 (a map); nil entries as RESP2's
// *-1 or RESP3's _.
func encodeXRead(stream string, entries []rawEntry, resp3 bool) []byte {
	var b strings.Builder
	if len(entries) == 0 {
		if resp3 {
			return []byte("_\r\n")
		}
		return []byte("*-1\r\n")
	}
	if resp3 {
		b.WriteString("%1\r\n")
	} else {
		b.WriteString("*1\r\n*2\r\n")
	}
	bulk(&b, stream)
	fmt.Fprintf(&b, "*%d\r\n", len(entries))
	for _, e := range entries {
		b.WriteString("*2\r\n")
		bulk(&b, e.id)
		switch {
		case e.fields == nil && resp3:
			b.WriteString("_\r\n")
		case e.fields == nil:
			b.WriteString("*-1\r\n")
		default:
			fmt.Fprintf(&b, "*%d\r\n", len(e.fields))
			for _, f := range e.fields {
				bulk(&b, f)
			}
		}
	}
	return []byte(b.String())
}

// typedParse has go-redis's XReadGroup parse reply: a fake server answers
// the command with it.
func typedParse(t testing.TB, reply []byte) ([]redis.XStream, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		for { // answer XREADGROUP with reply, the handshake as an old server
			line, err := rd.ReadString('\n')
			if err != nil || len(line) < 3 {
				return
			}
			n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
			var name string
			for k := range n {
				hdr, err := rd.ReadString('\n')
				if err != nil || len(hdr) < 3 {
					return
				}
				size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
				arg := make([]byte, size+2)
				if _, err := io.ReadFull(rd, arg); err != nil {
					return
				}
				if k == 0 {
					name = strings.ToLower(string(arg[:size]))
				}
			}
			switch name {
			case "xreadgroup":
				_, _ = c.Write(reply)
			case "hello": // go-redis falls back to RESP2
				_, _ = c.Write([]byte("-ERR unknown command\r\n"))
			default:
				_, _ = c.Write([]byte("+OK\r\n"))
			}
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Protocol: 2, DisableIdentity: true,
		MaxRetries: -1, ReadTimeout: 10 * time.Second})
	defer rdb.Close()
	return rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"s", ">"}, Count: 10, Block: -1}).Result()
}

// checkSame checks that parseXRead reads reply as go-redis does.
func checkSame(t testing.TB, reply []byte) {
	t.Helper()
	want, wantErr := typedParse(t, reply)
	got, err := parseXRead(reply)
	if (err == nil) != (wantErr == nil) || errors.Is(err, redis.Nil) != errors.Is(wantErr, redis.Nil) {
		t.Fatalf("parseXRead(%.200q) error %v, go-redis %v", reply, err, wantErr)
	}
	if g := typedOf(got); !reflect.DeepEqual(g, want) {
		t.Fatalf("parseXRead(%.200q) = %.300v, go-redis %.300v", reply, g, want)
	}
}

// typedOf returns res as go-redis's XReadGroup returns it (a map per entry,
// the last value of a name given twice).
func typedOf(res []streamRead) []redis.XStream {
	if res == nil {
		return nil
	}
	out := make([]redis.XStream, len(res))
	for i, x := range res {
		out[i] = redis.XStream{Stream: x.stream, Messages: make([]redis.XMessage, len(x.entries))}
		for j, e := range x.entries {
			out[i].Messages[j].ID = e.id
			if e.fields != nil {
				out[i].Messages[j].Values = fieldMap(e.fields)
			}
		}
	}
	return out
}

func TestParseXRead_asGoRedis(t *testing.T) {
	t.Parallel()
	cases := map[string][]rawEntry{
		"none":      nil,
		"one":       {{"1-0", []string{"v", "1", "type", "email", "payload", `{"a":1}`}}},
		"deleted":   {{"1-0", nil}, {"2-0", []string{"v", "1"}}},
		"empty":     {{"1-0", []string{}}},
		"binary":    {{"1-0", []string{"\x00\r\n", "\xff\r\n\x00", "", ""}}},
		"duplicate": {{"1-0", []string{"type", "a", "type", "b", "v", "1"}}},
		"many":      {{"1-0", strings.Split(strings.Repeat("k,v,", 300)+"x,y", ",")}},
	}
	for name, entries := range cases {
		for _, resp3 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/resp3=%v", name, resp3), func(t *testing.T) {
				checkSame(t, encodeXRead("s", entries, resp3))
			})
		}
	}
}

func TestParseXRead_errorsAndShapes(t *testing.T) {
	t.Parallel()
	_, err := parseXRead([]byte("-NOGROUP No such key 's' or consumer group 'g'\r\n"))
	var rerr redis.Error
	if !errors.As(err, &rerr) || !strings.HasPrefix(err.Error(), "NOGROUP") {
		t.Fatalf("error reply: got %v, want a redis.Error starting NOGROUP", err)
	}
	// A 4-element entry (XREADGROUP CLAIM) and a verbatim string.
	got, err := parseXRead([]byte("*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*4\r\n$3\r\n1-0\r\n*2\r\n$1\r\na\r\n=7\r\ntxt:abc\r\n:5\r\n:2\r\n"))
	want := []streamRead{{stream: "s", entries: []entry{{id: "1-0", fields: []string{"a", "abc"}}}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, %v; want %#v", got, err, want)
	}
	for _, bad := range []string{"", "*", "*1\r\n", "*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*1\r\n$1\r\na\r\n",
		"*1\r\n*2\r\n$9\r\ns\r\n", "*99999999999\r\n", ":1\r\n", "*-2\r\n", "*1\r\n*2\r\n$1\r\ns\r\n*0\r\nextra"} {
		if _, err := parseXRead([]byte(bad)); !errors.Is(err, errBadReply) {
			t.Errorf("parseXRead(%q): got %v, want errBadReply", bad, err)
		}
	}
}

// FuzzParseXRead checks that parseXRead never panics, and that it reads any
// well-formed reply (entries of any field count, size or bytes) as go-redis
// does.
func FuzzParseXRead(f *testing.F) {
	f.Add([]byte("*-1\r\n"), "type\x00email\x00v\x001", uint8(3), false)
	f.Add([]byte("%1\r\n$1\r\ns\r\n_\r\n"), "a\x00\r\n\x00\x00", uint8(0), true)
	f.Fuzz(func(t *testing.T, junk []byte, fields string, n uint8, resp3 bool) {
		_, _ = parseXRead(junk) // must not panic
		var entries []rawEntry
		for i := range int(n % 8) {
			var fs []string
			if i%5 != 4 { // every fifth entry deleted
				fs = strings.Split(fields, "\x00")
				if len(fs)%2 != 0 {
					fs = fs[1:]
				}
			}
			entries = append(entries, rawEntry{id: fmt.Sprintf("%d-%d", i+1, i), fields: fs})
		}
		checkSame(t, encodeXRead("s", entries, resp3))
	})
}

// fieldMap returns fields (names and values, as in an entry) as a map, the
// last value of a name given twice.
func fieldMap(fields []string) map[string]any {
	m := make(map[string]any, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i]] = fields[i+1]
	}
	return m
}
