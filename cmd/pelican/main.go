// Command pelican inspects and operates Pelican queues: stats, pending jobs,
// enqueue, safe trim, the dead-letter stream and the web dashboard.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// codeError is an error that carries the process exit code.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

// fail returns an error that makes pelican exit with code and print the
// formatted message. %w in format wraps as with fmt.Errorf.
func fail(code int, format string, args ...any) error {
	return &codeError{code: code, err: fmt.Errorf(format, args...)}
}

// exitCode returns the exit code for err: its codeError code, or exitError.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *codeError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitError
}

const defaultRedisURL = "redis://127.0.0.1:6379/0"

const rootLong = `pelican inspects and operates Pelican job queues on Redis Streams.

Connect with --redis URL, else $REDIS_URL, else ` + defaultRedisURL + `:
  redis://[user:pass@]host:port/db     single node
  rediss://...                         TLS (see the --tls-* flags)
  redis+cluster://host1:port,host2:port/?...  (or --cluster)  Redis Cluster
pelican never prints a password: URLs in messages show it as xxxxx.

TLS (rediss:// only): the server's certificate is checked against the
system's roots, or against the CA in --tls-ca. --tls-cert and --tls-key
give a client certificate, for a server that requires one (mutual TLS).
--tls-insecure skips the server's verification: anyone on the path can
read and change the traffic; use it only to test.

Every read command takes --output json for scripts.

Exit codes:
  0  success
  1  the command failed (Redis unreachable, wrong key type, Redis error)
  2  usage error: bad flags, arguments, --output value, filter syntax or JSON
  3  refused: confirmation declined, or another replay is active
  4  not found: unknown stream, group or entry
  130  interrupted (Ctrl-C during dlq replay; run it again to continue)`

// newRoot builds the pelican command tree around a.
func newRoot(a *app) *cobra.Command {
	var conn connFlags
	root := &cobra.Command{
		Use:           "pelican",
		Short:         "Inspect and operate Pelican job queues",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if a.output != "table" && a.output != "json" {
				return fail(exitUsage, "invalid --output %q: want table or json", a.output)
			}
			if conn.url == "" {
				conn.url = cmp.Or(os.Getenv("REDIS_URL"), defaultRedisURL)
			}
			// Checked when a command connects, not here, so a bad
			// $REDIS_URL does not break help or completion.
			a.connect = func(ctx context.Context) (redis.UniversalClient, error) {
				d, err := newDialer(conn)
				if err != nil {
					return nil, err
				}
				return d.connect(ctx)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	// The default is not $REDIS_URL itself: help would print its password.
	pf.StringVar(&conn.url, "redis", "", "Redis URL (redis://, rediss://, redis+cluster://); default $REDIS_URL, else "+defaultRedisURL)
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.BoolVarP(&a.yes, "yes", "y", false, "do not ask for confirmation")
	pf.BoolVar(&conn.cluster, "cluster", false, "connect to a Redis Cluster (also implied by redis+cluster://)")
	pf.StringVar(&conn.tlsCA, "tls-ca", "", "PEM `file` of the CA certificates that verify the server (rediss:// only; default: the system's roots)")
	pf.StringVar(&conn.tlsCert, "tls-cert", "", "PEM `file` of the client certificate, for mutual TLS (needs --tls-key)")
	pf.StringVar(&conn.tlsKey, "tls-key", "", "PEM `file` of the client certificate's private key (needs --tls-cert)")
	pf.BoolVar(&conn.tlsInsecure, "tls-insecure", false, "INSECURE: do not verify the server's certificate or host name (tests only)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &codeError{code: exitUsage, err: err}
	})
	for _, c := range commands {
		root.AddCommand(c(a))
	}
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.errOut)
	return root
}

// run executes pelican with args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{out: stdout, errOut: stderr, in: stdin}
	root := newRoot(a)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	var ee *codeError
	if !errors.As(err, &ee) && isUsageError(err) {
		code = exitUsage
	}
	fmt.Fprintf(stderr, "pelican: %v\n", err)
	return code
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// isUsageError reports whether err is one of cobra's argument errors, which
// carry no exit code of their own.
func isUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "requires at most", "unknown flag", "unknown shorthand", "required flag", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
