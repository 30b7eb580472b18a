package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/pelicanqueue/pelican/dashboard"
)

func init() { commands = append(commands, newWebCmd) }

// Environment variables that hold pelican web's credentials: never flags,
// which other users of the machine can read in the process list.
const (
	envWebToken    = "PELICAN_WEB_TOKEN"
	envWebUser     = "PELICAN_WEB_USER"
	envWebPassword = "PELICAN_WEB_PASSWORD"
)

type webFlags struct {
	listen       string
	allowActions bool
	traceURL     string
	stuckAfter   time.Duration
	partitions   int
}

func newWebCmd(a *app) *cobra.Command {
	var f webFlags
	cmd := &cobra.Command{
		Use:   "web [stream...]",
		Short: "Serve the web dashboard",
		Long: `web serves the dashboard (package dashboard) until interrupted: every queue
(or only the streams named), its groups, consumers, stuck and delayed jobs,
and its dead letters with a job view.

It is read-only unless --allow-actions: then dead letters can be replayed,
purged or deleted and delayed jobs run now, each after a confirmation page
that states how many jobs it touches.

Auth comes from the environment, never from flags:
  ` + envWebToken + `                       requests need "Authorization: Bearer <token>"
  ` + envWebUser + ` and ` + envWebPassword + `   basic auth
With both set, either is accepted. It listens on 127.0.0.1:8080 by default;
a --listen address that is not loopback is refused unless auth is set.
Serve it behind TLS (a reverse proxy) when it leaves the machine.

A partitioned queue (stream.Partitions): --partitions N makes every stream
argument the name of a queue of N partitions, and the dashboard shows its
partitions' streams (pelican web orders --partitions 12).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			auth, err := webAuthFromEnv()
			if err != nil {
				return err
			}
			if err := checkListen(f.listen, auth != nil); err != nil {
				return err
			}
			streams := args
			if f.partitions != 0 {
				if len(args) == 0 {
					return fail(exitUsage, "--partitions needs the queues' names")
				}
				refs, err := partitionedRefs(args, f.partitions)
				if err != nil {
					return err
				}
				streams = nil
				for _, r := range refs {
					streams = append(streams, r.partitions...)
				}
			}
			cfg := dashboard.Config{ReadOnly: !f.allowActions, Streams: streams, TraceURL: f.traceURL, StuckAfter: f.stuckAfter}
			if err := cfg.Validate(); err != nil {
				return fail(exitUsage, "%v", err)
			}
			ctx := cmd.Context()
			return withClient(ctx, a, func(rdb redis.UniversalClient) error {
				return serveWeb(ctx, a, rdb, f, cfg, auth)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to listen on (host:port); not loopback only with auth")
	fl.BoolVar(&f.allowActions, "allow-actions", false, "allow replay, purge, delete and run-now (default: read-only)")
	fl.StringVar(&f.traceURL, "trace-url", "", "link trace IDs to this URL, {trace_id} replaced (e.g. http://jaeger:16686/trace/{trace_id})")
	fl.IntVar(&f.partitions, "partitions", 0, "each stream argument names a partitioned queue of this many partitions")
	fl.DurationVar(&f.stuckAfter, "stuck-after", dashboard.DefaultStuckAfter, "list entries pending longer than this as stuck")
	return cmd
}

func serveWeb(ctx context.Context, a *app, rdb redis.UniversalClient, f webFlags, cfg dashboard.Config, auth *webAuth) error {
	d, err := dashboard.New(rdb, cfg)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	defer d.Close()
	var h http.Handler = d
	if auth != nil {
		h = auth.wrap(d)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fail(exitError, "listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	mode := "read-only"
	if !cfg.ReadOnly {
		mode = "actions allowed"
	}
	fmt.Fprintf(a.errOut, "pelican web: serving http://%s/ (%s)\n", ln.Addr(), mode)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fail(exitError, "serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// checkListen refuses a listen address that is not loopback when no auth
// is configured: the dashboard would show every queue to the network.
func checkListen(listen string, hasAuth bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fail(exitUsage, "invalid --listen %q: %v", listen, err)
	}
	if hasAuth || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fail(exitUsage, "--listen %s is not a loopback address and no auth is set: set %s, or %s and %s, or listen on 127.0.0.1",
		listen, envWebToken, envWebUser, envWebPassword)
}

// webAuth checks the credentials of pelican web's requests.
type webAuth struct {
	token      [32]byte // SHA-256 of the bearer token, when hasToken
	hasToken   bool
	user, pass [32]byte
	hasBasic   bool
}

func webAuthFromEnv() (*webAuth, error) {
	token, user, pass := os.Getenv(envWebToken), os.Getenv(envWebUser), os.Getenv(envWebPassword)
	if (user == "") != (pass == "") {
		return nil, fail(exitUsage, "set both %s and %s for basic auth, or neither", envWebUser, envWebPassword)
	}
	if token == "" && user == "" {
		return nil, nil
	}
	a := &webAuth{}
	if token != "" {
		a.token, a.hasToken = sha256.Sum256([]byte(token)), true
	}
	if user != "" {
		a.user, a.pass, a.hasBasic = sha256.Sum256([]byte(user)), sha256.Sum256([]byte(pass)), true
	}
	return a, nil
}

// errBadCredentials is never shown; it selects the 401.
var errBadCredentials = errors.New("missing or wrong credentials")

// check accepts a request with the right bearer token or basic auth
// (compared in constant time, over hashes so that lengths do not leak).
func (a *webAuth) check(r *http.Request) error {
	if a.hasToken {
		if tok, ok := bearer(r); ok {
			h := sha256.Sum256([]byte(tok))
			if subtle.ConstantTimeCompare(h[:], a.token[:]) == 1 {
				return nil
			}
		}
	}
	if a.hasBasic {
		if u, p, ok := r.BasicAuth(); ok {
			hu, hp := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
			if subtle.ConstantTimeCompare(hu[:], a.user[:])&subtle.ConstantTimeCompare(hp[:], a.pass[:]) == 1 {
				return nil
			}
		}
	}
	return errBadCredentials
}

func bearer(r *http.Request) (string, bool) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) > len(prefix) && http.CanonicalHeaderKey(h[:6]) == "Bearer" {
		return h[len(prefix):], true
	}
	return "", false
}

// wrap answers 401 with a challenge to requests that fail check.
func (a *webAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.check(r) != nil {
			if a.hasBasic {
				w.Header().Set("WWW-Authenticate", `Basic realm="pelican", charset="UTF-8"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer realm="pelican"`)
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
