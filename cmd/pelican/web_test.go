package main

import (
	"bufio"
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// startWeb runs pelican web with args and env on a free port and returns
// its base URL; the process is interrupted when t ends.
func startWeb(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(cliPath, append([]string{"web", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REDIS_URL=" + testRedisURL()}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if s := sc.Text(); strings.Contains(s, "serving http://") {
				line <- s
			}
		}
	}()
	select {
	case s := <-line:
		u := s[strings.Index(s, "http://"):]
		return strings.TrimSuffix(u[:strings.IndexByte(u, ' ')], "/")
	case <-time.After(60 * time.Second):
		t.Fatal("pelican web did not say where it serves")
	}
	return ""
}

func webGet(t *testing.T, u string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestWeb_nonLoopbackWithoutAuthRefused(t *testing.T) {
	t.Parallel()
	// Redis at a closed port: the refusal comes before any connection.
	for _, listen := range []string{"0.0.0.0:0", ":0", "192.0.2.1:8080"} {
		_, stderr, code := runCLI(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "", "web", "--listen", listen)
		if code != exitUsage || !strings.Contains(stderr, "not a loopback address") || !strings.Contains(stderr, envWebToken) {
			t.Errorf("web --listen %s: exit %d, %q; want exit 2 naming the auth variables", listen, code, stderr)
		}
	}
	_, stderr, code := runCLI(t, []string{"REDIS_URL=redis://127.0.0.1:1/0", envWebUser + "=ops"}, "", "web")
	if code != exitUsage || !strings.Contains(stderr, envWebPassword) {
		t.Errorf("user without password: exit %d, %q", code, stderr)
	}
}

func TestWeb_readOnlyByDefault(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	base := startWeb(t, nil, q.name)
	code, body := webGet(t, base+"/queues/"+url.PathEscape(q.name)+"/dead")
	if code != 200 || !strings.Contains(body, "read-only") || strings.Contains(body, `method="post"`) {
		t.Fatalf("dead page: %d, read-only shown: %v, forms: %v", code, strings.Contains(body, "read-only"), strings.Contains(body, `method="post"`))
	}
	res, err := http.PostForm(base+"/queues/"+url.PathEscape(q.name)+"/dead/purge", url.Values{"confirm": {"3"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("POST to a read-only pelican web = %d, want 403", res.StatusCode)
	}
	if n, _ := q.rdb.XLen(context.Background(), q.keys.Dead).Result(); n != 3 {
		t.Errorf("read-only pelican web changed the DLQ: %d left", n)
	}

	base = startWeb(t, nil, "--allow-actions", q.name)
	_, body = webGet(t, base+"/queues/"+url.PathEscape(q.name)+"/dead")
	if !strings.Contains(body, `method="post"`) {
		t.Errorf("--allow-actions shows no action")
	}
}

func TestWeb_auth(t *testing.T) {
	t.Parallel()
	q := setupQueue(t)
	const token, user, pass = "s3cret-token", "ops", "pa:ss"
	base := startWeb(t, []string{envWebToken + "=" + token, envWebUser + "=" + user, envWebPassword + "=" + pass}, q.name)
	page := base + "/queues/" + url.PathEscape(q.name)
	for name, tc := range map[string]struct {
		hdr  []string
		want int
	}{
		"none":         {nil, 401},
		"wrong token":  {[]string{"Authorization", "Bearer nope"}, 401},
		"token":        {[]string{"Authorization", "Bearer " + token}, 200},
		"wrong basic":  {[]string{"Authorization", "Basic b3BzOm5vcGU="}, 401},
		"basic":        {[]string{"Authorization", "Basic b3BzOnBhOnNz"}, 200}, // ops:pa:ss
		"token prefix": {[]string{"Authorization", "Bearer " + token[:5]}, 401},
	} {
		code, body := webGet(t, page, tc.hdr...)
		if code != tc.want {
			t.Errorf("%s: %d, want %d", name, code, tc.want)
		}
		if code == 401 && (strings.Contains(body, token) || strings.Contains(body, pass)) {
			t.Errorf("%s: a credential is in the response", name)
		}
	}
	res, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("401 without a basic challenge: %q", res.Header.Get("WWW-Authenticate"))
	}
}

// TestWeb_partitions: --partitions N serves the N partition streams of each
// queue named, and is a usage error without a name or with a bad one.
func TestWeb_partitions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"web", "--partitions", "3"}, {"web", "--partitions", "3", "a~b"}, {"web", "--partitions", "2000", "q"}} {
		if _, stderr, code := runCLI(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "", args...); code != exitUsage {
			t.Errorf("%v: exit %d (%s), want %d", args, code, stderr, exitUsage)
		}
	}
	q := setupQueue(t)
	parts, err := stream.Partitions(q.name, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := q.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: p, Values: []any{"type", "t"}}).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.rdb.Del(context.Background(), p) })
	}
	base := startWeb(t, nil, "--partitions", "3", q.name)
	for _, p := range parts {
		if code, body := webGet(t, base+"/queues/"+url.PathEscape(p)); code != 200 || !strings.Contains(body, html.EscapeString(p)) {
			t.Errorf("page of partition %s: %d, names it: %v", p, code, strings.Contains(body, html.EscapeString(p)))
		}
	}
}
