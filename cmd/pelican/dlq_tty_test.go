package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// tmuxSession runs shell command line in a detached 120x30 tmux session on
// a private server socket, killed when the test ends.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func startTmux(t *testing.T, line string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("terminal test skipped: tmux is not installed (scripts/test.sh installs it; apt-get install tmux)")
	}
	s := &tmuxSession{t: t, socket: "pelican-dlq-" + strings.NewReplacer("/", "-", ":", "-").Replace(t.Name()) + "-" + time.Now().Format("150405.000000")}
	// The pane keeps the exit status visible after the command ends.
	cmd := exec.Command("tmux", "-L", s.socket, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "120", "-y", "30",
		line+`; echo "EXIT=$?"; sleep 600`)
	cmd.Env = append(os.Environ(), "TERM=xterm-256color")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", s.socket, "kill-server").Run() })
	return s
}

func (s *tmuxSession) capture() string {
	out, err := exec.Command("tmux", "-L", s.socket, "capture-pane", "-p", "-J", "-t", "t").CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux capture-pane: %v\n%s", err, out)
	}
	return string(out)
}

// waitFor polls the pane until it matches re, and returns it.
func (s *tmuxSession) waitFor(re string) string {
	s.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(20 * time.Second)
	for {
		pane := s.capture()
		if rx.MatchString(pane) {
			return pane
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("terminal never showed %q; pane:\n%s", re, pane)
		}
		time.Sleep(20 * time.Millisecond) // polling the pane
	}
}

func (s *tmuxSession) send(keys ...string) {
	s.t.Helper()
	args := append([]string{"-L", s.socket, "send-keys", "-t", "t"}, keys...)
	if out, err := exec.Command("tmux", args...).CombinedOutput(); err != nil {
		s.t.Fatalf("tmux send-keys: %v\n%s", err, out)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func pelicanLine(args ...string) string {
	q := []string{"env", shellQuote("REDIS_URL=" + testRedisURL()), shellQuote(cliPath)}
	for _, a := range args {
		q = append(q, shellQuote(a))
	}
	return strings.Join(q, " ")
}

func TestDLQ_TerminalProgress(t *testing.T) {
	t.Parallel()

	t.Run("replay", func(t *testing.T) {
		t.Parallel()
		fx := setupDLQ(t)
		want := fx.addMany(t, 200)
		s := startTmux(t, pelicanLine("dlq", "replay", fx.source, "--rate", "100"))
		s.waitFor(`Replay 200 jobs from .* to .* at 100/s\? \[y/N\]`)
		s.send("y", "Enter")
		// Mid-run: a bar with the count, the rate and the time left.
		pane := s.waitFor(`replay +\d+% \|[^|]*\| \(\d+/200, \d+ jobs/s\) \[[0-9ms.]+:[0-9ms.]+\]`)
		t.Logf("mid-run pane:\n%s", pane)
		pane = s.waitFor(`EXIT=\d+`)
		t.Logf("final pane:\n%s", pane)
		if !strings.Contains(pane, "EXIT=0") || !strings.Contains(pane, "replayed 200 jobs") {
			t.Errorf("replay did not finish cleanly:\n%s", pane)
		}
		fx.checkReplayedOnce(t, want)
	})

	t.Run("purge", func(t *testing.T) {
		t.Parallel()
		fx := setupDLQ(t)
		fx.addMany(t, 1000)
		s := startTmux(t, pelicanLine("dlq", "purge", fx.source))
		s.waitFor(`Delete all 1000 entries from .*\? \[y/N\]`)
		s.send("y", "Enter")
		pane := s.waitFor(`EXIT=\d+`)
		t.Logf("final pane:\n%s", pane)
		if !regexp.MustCompile(`purge +100% \|[^|]*\| \(1000/1000, \d+ entries/s\)`).MatchString(pane) {
			t.Errorf("no finished progress bar in the pane:\n%s", pane)
		}
		if !strings.Contains(pane, "EXIT=0") || !strings.Contains(pane, "deleted 1000 entries") {
			t.Errorf("purge did not finish cleanly:\n%s", pane)
		}
		if n := fx.rdb.XLen(fx.ctx, fx.dead).Val(); n != 0 {
			t.Errorf("%d entries left after purge", n)
		}
	})

	t.Run("ctrl-c", func(t *testing.T) {
		t.Parallel()
		fx := setupDLQ(t)
		want := fx.addMany(t, 300)
		// Ctrl-C at the prompt: nothing replayed, exit 130.
		s := startTmux(t, pelicanLine("dlq", "replay", fx.source, "--rate", "100"))
		s.waitFor(`\[y/N\]`)
		s.send("C-c")
		pane := s.waitFor(`EXIT=\d+`)
		if !strings.Contains(pane, "EXIT=130") || fx.rdb.XLen(fx.ctx, fx.source).Val() != 0 {
			t.Fatalf("Ctrl-C at the prompt: want exit 130 and nothing replayed; pane:\n%s", pane)
		}
		// Ctrl-C during the replay, then the same command again.
		s = startTmux(t, pelicanLine("dlq", "replay", fx.source, "--rate", "100", "--yes"))
		s.waitFor(`\(\d\d+/300, \d+ jobs/s\)`)
		s.send("C-c")
		pane = s.waitFor(`EXIT=\d+`)
		t.Logf("interrupted pane:\n%s", pane)
		if !strings.Contains(pane, "EXIT=130") || !strings.Contains(pane, "run the same command again") {
			t.Errorf("Ctrl-C during replay: want exit 130 and how to resume; pane:\n%s", pane)
		}
		o, e, code := runCLI(t, nil, "", "dlq", "replay", fx.source, "--rate", "0", "--yes")
		mustCode(t, 0, o, e, code)
		fx.checkReplayedOnce(t, want)
	})
}
