package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// a11Web starts pelican web and returns its base URL, or "" and its exit
// error when it exits before saying where it serves.
func a11Web(t *testing.T, bin string, env []string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"web", "--redis", "redis://127.0.0.1:6379/0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	for _, k := range []string{"PELICAN_WEB_TOKEN", "PELICAN_WEB_USER", "PELICAN_WEB_PASSWORD"} {
		set := false
		for _, e := range env {
			set = set || strings.HasPrefix(e, k+"=")
		}
		if !set {
			cmd.Env = append(cmd.Env, k+"=") // cleared unless the case sets it (an empty value is unset)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, _ := cmd.StderrPipe()
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var all []string
	re := regexp.MustCompile(`serving (http://\S+?)/? `)
	for l := range lines {
		all = append(all, l)
		if m := re.FindStringSubmatch(l + " "); m != nil {
			go func() {
				for range lines {
				}
			}()
			return m[1], ""
		}
	}
	cmd.Wait()
	return "", strings.Join(all, "\n") + " exit " + cmd.ProcessState.String()
}

// Promise (README, SECURITY.md, pelican web --help): "refuses a --listen address
// that is not loopback unless one of them is set"; credentials come from the
// environment: PELICAN_WEB_TOKEN (Bearer) or PELICAN_WEB_USER/PASSWORD (basic),
// "either is accepted when both are set"; read-only unless --allow-actions.
func TestAttack11_PelicanWeb(t *testing.T) {
	t.Parallel()
	bin := pelicanCLI(t)
	for _, l := range []string{"0.0.0.0:0", ":0", "[::]:0", "0:0", "[::ffff:0.0.0.0]:0"} {
		if u, _ := a11Web(t, bin, nil, "a11-web-none", "--listen", l); u != "" {
			t.Errorf("--listen %s without auth: serving at %s, want refused", l, u)
		}
	}
	for _, env := range [][]string{{"PELICAN_WEB_USER=u"}, {"PELICAN_WEB_PASSWORD=p"}} {
		if u, _ := a11Web(t, bin, env, "a11-web-none", "--listen", "0.0.0.0:0"); u != "" {
			t.Errorf("%v (half of basic auth) on 0.0.0.0: serving at %s, want refused", env, u)
		}
	}
	tok := "tok-a11-" + base64.RawURLEncoding.EncodeToString([]byte(time.Now().String()))
	u, msg := a11Web(t, bin, []string{"PELICAN_WEB_TOKEN=" + tok, "PELICAN_WEB_USER=ann", "PELICAN_WEB_PASSWORD=pw:with:colons"},
		"a11-web-none", "--listen", "0.0.0.0:0")
	if u == "" {
		t.Fatalf("with auth on 0.0.0.0: %s", msg)
	}
	u = strings.Replace(strings.Replace(u, "[::]", "127.0.0.1", 1), "0.0.0.0", "127.0.0.1", 1)
	do := func(method, path, auth string) int {
		req, _ := http.NewRequestWithContext(context.Background(), method, u+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	basic := func(u, p string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p)) }
	for _, path := range []string{"/", "/assets/app.js", "/queues/a11-web-none", "/queues/a11-web-none/dead", "/nope"} {
		for _, bad := range []string{"", "Bearer", "Bearer ", "Bearer " + tok + "x", "Bearer " + tok[:len(tok)-1], "bearer  " + tok + " ",
			"Basic " + tok, basic("ann", "pw"), basic("ann", "pw:with:colon"), basic("Ann", "pw:with:colons"), basic("", ""),
			basic("ann", ""), "Token " + tok, basic("ann", "pw:with:colons") + "x"} {
			if c := do("GET", path, bad); c != http.StatusUnauthorized {
				t.Errorf("GET %s with Authorization %q: %d, want 401", path, bad, c)
			}
		}
		if c := do("GET", path, "Bearer "+tok); c == http.StatusUnauthorized || c == http.StatusForbidden {
			t.Errorf("GET %s with the token: %d", path, c)
		}
		if c := do("GET", path, basic("ann", "pw:with:colons")); c == http.StatusUnauthorized || c == http.StatusForbidden {
			t.Errorf("GET %s with basic auth: %d", path, c)
		}
	}
	// Read-only by default: every action POST refused even when authenticated.
	for _, path := range []string{"/queues/a11-web-none/dead/purge", "/queues/a11-web-none/dead/replay", "/queues/a11-web-none/dead/1-1/delete"} {
		if c := do("POST", path, "Bearer "+tok); c != http.StatusForbidden {
			t.Errorf("read-only pelican web: POST %s: %d, want 403", path, c)
		}
	}
}
