package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/internal/redistest"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379/0":           "redis://127.0.0.1:6379/0",
		"rediss://u:secret@h:6380/1":         "rediss://u:xxxxx@h:6380/1",
		"redis://h:1/0?password=secret&db=1": "redis://h:1/0?password=xxxxx&db=1",
		"redis+cluster://:pw@a:1,b:2/?x=y":   "redis+cluster://:xxxxx@a:1,b:2/?x=y",
		// Unparsable URLs are redacted too.
		"redis://:secret@[bad":      "redis://:xxxxx@[bad",
		"redis://u:se%zzret@h:1":    "redis://u:xxxxx@h:1",
		"redis://:se@cr/et?#@h:1/0": "redis://:xxxxx@h:1/0",
		// redis-cli reads user information without ":" as a password.
		"redis://secret@h:1": "redis://xxxxx@h:1",
		"u:secret@h:1":       "u:xxxxx@h:1",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClusterHosts(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://a:1":                          "redis://a:1",
		"redis://a:1,b:2,c:3/":                 "redis://a:1/?addr=b%3A2&addr=c%3A3",
		"rediss://u:p@a:1,b:2/?dial_timeout=3": "rediss://u:p@a:1/?dial_timeout=3&addr=b%3A2",
	} {
		if got := clusterHosts(in); got != want {
			t.Errorf("clusterHosts(%q) = %q, want %q", in, got, want)
		}
	}
}

// secret is the password in the URLs of TestConnect_secretsNeverPrinted;
// pelican must never print it.
const secret = "s3cr3t-Pw-7Q"

// TestConnect_secretsNeverPrinted runs every path that prints or may print
// the --redis URL, or an error made from it, with a URL that holds a
// password, and checks that the password appears in neither stdout nor
// stderr. want proves the path was taken.
func TestConnect_secretsNeverPrinted(t *testing.T) {
	t.Parallel()
	// Passwords are set once the servers run: redistest's readiness probe
	// does not authenticate.
	authed := redistest.Start(t, redistest.Options{})
	other := redistest.Start(t, redistest.Options{})
	tlsSrv := redistest.Start(t, redistest.Options{TLS: &redistest.TLSOptions{}})
	ctx := context.Background()
	for srv, pw := range map[*redistest.Server]string{authed: secret, other: "another-password"} {
		if err := srv.Client(t).ConfigSet(ctx, "requirepass", pw).Err(); err != nil {
			t.Fatalf("CONFIG SET requirepass: %v", err)
		}
	}
	name := redistest.Name(t)
	authURL := "redis://:" + secret + "@" + authed.Addr() + "/0"
	// A stream for the commands below; enqueue is a path too.
	out, errOut, code := runCLI(t, nil, "", "--redis", authURL, "enqueue", name, "--type", "t", "--payload", "{}")
	if code != exitOK || strings.Contains(out+errOut, secret) {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q; want success, and no password", code, out, errOut)
	}

	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		// The URL does not parse.
		{"bad host", nil, []string{"--redis", "redis://:" + secret + "@[bad", "stats"}, exitUsage, "missing ']' in host"},
		{"bad escape in password", nil, []string{"--redis", "redis://u:" + secret + "%zz@127.0.0.1:1", "stats"}, exitUsage, "password is not valid in a URL"},
		{"unescaped slash in password", nil, []string{"--redis", "redis://:" + secret + "/x@127.0.0.1:1", "stats"}, exitUsage, "password is not valid in a URL"},
		{"control character", nil, []string{"--redis", "redis://:" + secret + "\x01@127.0.0.1:1", "stats"}, exitUsage, "invalid --redis URL redis://:xxxxx@127.0.0.1:1"},
		{"no scheme", nil, []string{"--redis", "u:" + secret + "@127.0.0.1:1", "stats"}, exitUsage, "invalid --redis URL u:xxxxx@127.0.0.1:1"},
		{"bad database", nil, []string{"--redis", "redis://:" + secret + "@127.0.0.1:1/x", "stats"}, exitUsage, "invalid database number"},
		{"bad option value", nil, []string{"--redis", "redis://:" + secret + "@127.0.0.1:1/0?dial_timeout=zz", "stats"}, exitUsage, "dial_timeout"},
		{"password parameter", nil, []string{"--redis", "redis://127.0.0.1:1/0?password=" + secret, "stats"}, exitUsage, "password=xxxxx"},
		{"bad cluster address", nil, []string{"--redis", "redis+cluster://:" + secret + "@127.0.0.1:1/?addr=x", "stats"}, exitUsage, "addr"},
		// Bad flags, checked before connecting.
		{"tls flag on plain URL", nil, []string{"--redis", authURL, "--tls-insecure", "stats"}, exitUsage, "needs a rediss:// URL"},
		{"tls cert without key", nil, []string{"--redis", "rediss://:" + secret + "@127.0.0.1:1", "--tls-cert", "x", "stats"}, exitUsage, "--tls-cert needs --tls-key"},
		{"unknown flag", nil, []string{"--redis", authURL, "stats", "--nope"}, exitUsage, "unknown flag"},
		// Redis cannot be reached or refuses the password.
		{"refused", nil, []string{"--redis", "redis://:" + secret + "@127.0.0.1:1/0", "stats"}, exitError, "redis unreachable at redis://:xxxxx@127.0.0.1:1/0"},
		{"refused via env", []string{"REDIS_URL=redis://:" + secret + "@127.0.0.1:1/0"}, []string{"stats", "-o", "json"}, exitError, "redis://:xxxxx@127.0.0.1:1/0"},
		{"user information without colon", nil, []string{"--redis", "redis://" + secret + "@127.0.0.1:1/0", "stats"}, exitError, "redis://xxxxx@127.0.0.1:1/0"},
		{"cluster refused", nil, []string{"--redis", "redis+cluster://:" + secret + "@127.0.0.1:1,127.0.0.1:2/", "stats"}, exitError, "redis+cluster://:xxxxx@127.0.0.1:1,127.0.0.1:2/"},
		{"--cluster refused", nil, []string{"--redis", "redis://u:" + secret + "@127.0.0.1:1", "--cluster", "stats"}, exitError, "redis://u:xxxxx@127.0.0.1:1"},
		{"wrong password", nil, []string{"--redis", "redis://:" + secret + "@" + other.Addr(), "stats"}, exitError, "WRONGPASS"},
		{"wrong user", nil, []string{"--redis", "redis://nobody:" + secret + "@" + authed.Addr(), "stats"}, exitError, "WRONGPASS"},
		{"TLS unknown authority", nil, []string{"--redis", "rediss://:" + secret + "@" + tlsSrv.Addr(), "stats"}, exitError, "unknown authority"},
		{"rediss to a plain server", nil, []string{"--redis", "rediss://:" + secret + "@" + other.Addr(), "stats"}, exitError, "redis unreachable at rediss://:xxxxx@"},
		// Connected: commands that succeed, and that fail afterwards.
		{"stats", nil, []string{"--redis", authURL, "stats", name}, exitOK, "STREAM"},
		{"stats json", nil, []string{"--redis", authURL, "stats", name, "-o", "json"}, exitOK, ""},
		{"stats via env", []string{"REDIS_URL=" + authURL}, []string{"stats", name, "-o", "json"}, exitOK, ""},
		{"dlq ls json", nil, []string{"--redis", authURL, "dlq", "ls", name, "-o", "json"}, exitOK, ""},
		{"unknown stream", nil, []string{"--redis", authURL, "dlq", "ls", "nosuch-" + name}, exitNotFound, "unknown stream"},
		{"bad output", nil, []string{"--redis", authURL, "-o", "xml", "stats"}, exitUsage, "invalid --output"},
		// Help shows the flags' defaults.
		{"help", []string{"REDIS_URL=" + authURL}, []string{"--help"}, exitOK, "--redis"},
		{"command help", []string{"REDIS_URL=" + authURL}, []string{"stats", "--help"}, exitOK, "--redis"},
		{"help command", []string{"REDIS_URL=" + authURL}, []string{"help", "dlq", "ls"}, exitOK, "--redis"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := runCLI(t, tt.env, "", tt.args...)
			if strings.Contains(out, secret) || strings.Contains(errOut, secret) {
				t.Errorf("the password is printed:\nstdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if code != tt.code || !strings.Contains(out+errOut, tt.want) {
				t.Errorf("exit %d, want %d and %q in the output\nstdout:\n%s\nstderr:\n%s", code, tt.code, tt.want, out, errOut)
			}
		})
	}
}

// tlsArgs returns the --tls-ca, --tls-cert and --tls-key flags for files.
func tlsArgs(f redistest.TLSFiles, ca, cert bool) []string {
	var args []string
	if ca {
		args = append(args, "--tls-ca", f.CA)
	}
	if cert {
		args = append(args, "--tls-cert", f.ClientCert, "--tls-key", f.ClientKey)
	}
	return args
}

func TestConnect_TLS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		authClients bool
	}{
		{name: "server auth", authClients: false},
		{name: "mutual", authClients: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{TLS: &redistest.TLSOptions{AuthClients: tc.authClients}})
			f := srv.TLSFiles()
			url := "rediss://" + srv.Addr() + "/0"
			name := redistest.Name(t)
			args := append([]string{"--redis", url}, tlsArgs(f, true, tc.authClients)...)

			// Real commands over TLS.
			out, errOut, code := runCLI(t, nil, "", append(args, "enqueue", name, "--type", "t", "--payload", `{"n":1}`)...)
			if code != exitOK {
				t.Fatalf("enqueue: exit %d, stderr: %s", code, errOut)
			}
			if n, err := srv.Client(t).XLen(context.Background(), name).Result(); err != nil || n != 1 {
				t.Fatalf("XLEN after enqueue over TLS = %d, %v; want 1", n, err)
			}
			out, errOut, code = runCLI(t, nil, "", append(args, "stats", name, "-o", "json")...)
			var stats []struct {
				Stream string `json:"stream"`
				Length int64  `json:"length"`
			}
			if code != exitOK || json.Unmarshal([]byte(out), &stats) != nil || len(stats) != 1 || stats[0].Length != 1 {
				t.Fatalf("stats: exit %d, stdout %s, stderr %s; want length 1", code, out, errOut)
			}
			if _, errOut, code = runCLI(t, nil, "", append(args, "dlq", "ls", name)...); code != exitOK {
				t.Fatalf("dlq ls: exit %d, stderr: %s", code, errOut)
			}

			// --tls-insecure connects without the CA.
			insecure := append([]string{"--redis", url, "--tls-insecure"}, tlsArgs(f, false, tc.authClients)...)
			if _, errOut, code = runCLI(t, nil, "", append(insecure, "stats", name)...); code != exitOK {
				t.Errorf("--tls-insecure: exit %d, stderr: %s", code, errOut)
			}

			// Without the CA, the server's certificate is not trusted.
			noCA := append([]string{"--redis", url}, tlsArgs(f, false, tc.authClients)...)
			_, errOut, code = runCLI(t, nil, "", append(noCA, "stats", name)...)
			if code != exitError || !strings.Contains(errOut, "certificate signed by unknown authority") || !strings.Contains(errOut, "--tls-ca") {
				t.Errorf("without --tls-ca: exit %d, stderr %q; want exit 1, unknown authority and a hint naming --tls-ca", code, errOut)
			}

			// Without a client certificate.
			_, errOut, code = runCLI(t, nil, "", "--redis", url, "--tls-ca", f.CA, "stats", name)
			switch {
			case tc.authClients && (code != exitError || !strings.Contains(errOut, "certificate required") || !strings.Contains(errOut, "--tls-cert")):
				t.Errorf("mTLS server without --tls-cert: exit %d, stderr %q; want exit 1, certificate required and a hint naming --tls-cert", code, errOut)
			case !tc.authClients && code != exitOK:
				t.Errorf("without --tls-cert: exit %d, stderr %q; want success", code, errOut)
			}

			// A plain-text client does not get through.
			_, errOut, code = runCLI(t, nil, "", "--redis", "redis://"+srv.Addr()+"/0", "stats", name)
			if code != exitError || !strings.Contains(errOut, "rediss://") {
				t.Errorf("redis:// to a TLS server: exit %d, stderr %q; want exit 1 and a hint naming rediss://", code, errOut)
			}
		})
	}
}

// TestConnect_tlsFlags checks that bad TLS flags fail with exit 2, naming
// the flag, before connecting: the URL's server does not exist, so an
// attempt to connect would exit 1.
func TestConnect_tlsFlags(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{TLS: &redistest.TLSOptions{}})
	f := srv.TLSFiles()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	const url = "rediss://127.0.0.1:1/0"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"cert without key", []string{"--tls-cert", f.ClientCert}, "--tls-cert needs --tls-key"},
		{"key without cert", []string{"--tls-key", f.ClientKey}, "--tls-key needs --tls-cert"},
		{"insecure with CA", []string{"--tls-insecure", "--tls-ca", f.CA}, "--tls-insecure and --tls-ca exclude each other"},
		{"missing CA", []string{"--tls-ca", missing}, "--tls-ca: open " + missing},
		{"CA not PEM", []string{"--tls-ca", notPEM}, "--tls-ca " + notPEM + ": no PEM certificate"},
		{"missing cert", []string{"--tls-cert", missing, "--tls-key", f.ClientKey}, "--tls-cert: open " + missing},
		{"missing key", []string{"--tls-cert", f.ClientCert, "--tls-key", missing}, "--tls-key: open " + missing},
		{"key not PEM", []string{"--tls-cert", f.ClientCert, "--tls-key", notPEM}, "--tls-key " + notPEM + ":"},
		{"key of another certificate", []string{"--tls-cert", f.ClientCert, "--tls-key", f.ServerKey}, "private key does not match public key"},
		{"plain URL", []string{"--redis", "redis://127.0.0.1:1/0", "--tls-ca", f.CA}, "--tls-ca needs a rediss:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--redis", url}, tt.args...)
			out, errOut, code := runCLI(t, nil, "", append(args, "stats")...)
			if code != exitUsage || !strings.Contains(errOut, tt.want) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want exit 2 and one line with %q", code, errOut, tt.want)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			for _, keyFile := range []string{f.ClientKey, f.ServerKey} {
				key, err := os.ReadFile(keyFile)
				if err != nil {
					t.Fatal(err)
				}
				// The first line of the key's base64 body.
				if line := strings.Split(string(key), "\n")[1]; strings.Contains(errOut, line) {
					t.Errorf("stderr holds the private key %s: %s", keyFile, errOut)
				}
			}
		})
	}
}
