package main

import (
	"strings"
	"testing"
)

func TestMain_exitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     []string
		args    []string
		code    int
		message string
	}{
		{"unknown command", nil, []string{"nope"}, exitUsage, "unknown command"},
		{"unknown flag", nil, []string{"stats", "--nope"}, exitUsage, "unknown flag"},
		{"bad output", nil, []string{"--output", "xml", "stats"}, exitUsage, `invalid --output "xml"`},
		{"unreachable via env", []string{"REDIS_URL=redis://127.0.0.1:1/0"}, []string{"stats"}, exitError, "redis unreachable at redis://127.0.0.1:1/0"},
		{"bad url", nil, []string{"--redis", "http://x", "stats"}, exitUsage, "invalid --redis URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := runCLI(t, tt.env, "", tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.message) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", code, errOut, tt.code, tt.message)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			if strings.Count(errOut, "\n") != 1 {
				t.Errorf("stderr is not one line: %q", errOut)
			}
		})
	}
}

func TestMain_help(t *testing.T) {
	t.Parallel()
	out, _, code := runCLI(t, nil, "", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"Exit codes:", "4  not found", "stats", "pending", "enqueue", "trim"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
}
