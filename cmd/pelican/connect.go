package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pingTimeout bounds the first PING to Redis.
const pingTimeout = 3 * time.Second

// redacted replaces credentials in what pelican prints.
const redacted = "xxxxx"

// connFlags are the flags that say how to reach Redis.
type connFlags struct {
	url         string // --redis, else $REDIS_URL, else defaultRedisURL
	cluster     bool   // --cluster
	tlsCA       string // --tls-ca
	tlsCert     string // --tls-cert
	tlsKey      string // --tls-key
	tlsInsecure bool   // --tls-insecure
}

// dialer makes clients for one Redis. newDialer checks the URL and the TLS
// flags and reads the TLS files, so every mistake in them is reported
// before Redis is touched.
type dialer struct {
	shown   string // the URL with its credentials redacted
	single  *redis.Options
	cluster *redis.ClusterOptions // set instead of single for a Cluster
}

// newDialer parses f.url (a redis+cluster:// URL, or f.cluster, makes a
// Cluster client; rediss:// uses TLS) and applies the TLS flags. Its errors
// (exit 2) name the flag and never hold the URL's credentials.
func newDialer(f connFlags) (*dialer, error) {
	if err := f.checkTLS(); err != nil {
		return nil, err
	}
	d := &dialer{shown: redactURL(f.url)}
	var err error
	d.single, d.cluster, err = parseURL(f.url, f.cluster)
	if err != nil {
		// The parse error may quote the URL, credentials included: report
		// the error of the redacted URL instead.
		_, _, err = parseURL(d.shown, f.cluster)
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // without the URL, which the message shows anyway
		}
		if err == nil {
			err = errors.New("its user name or password is not valid in a URL " +
				"(percent-encode reserved characters: %40 for @, %3A for :, %2F for /, %25 for %)")
		}
		return nil, fail(exitUsage, "invalid --redis URL %s: %v", d.shown, err)
	}
	if err := f.applyTLS(d.tlsConfig()); err != nil {
		return nil, err
	}
	return d, nil
}

// tlsConfig returns the clients' TLS configuration, nil for plain text.
func (d *dialer) tlsConfig() *tls.Config {
	if d.cluster != nil {
		return d.cluster.TLSConfig
	}
	return d.single.TLSConfig
}

// parseURL parses rawURL into the options of a single-node client, or of a
// Cluster client if cluster is set or the scheme says so. Its errors may
// quote rawURL.
func parseURL(rawURL string, cluster bool) (*redis.Options, *redis.ClusterOptions, error) {
	if strings.HasPrefix(rawURL, "redis+cluster://") || strings.HasPrefix(rawURL, "rediss+cluster://") {
		cluster = true
		rawURL = clusterHosts(strings.Replace(rawURL, "+cluster://", "://", 1))
	}
	if cluster {
		opt, err := redis.ParseClusterURL(rawURL)
		return nil, opt, err
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, nil, err
	}
	opt.MaxRetries = 1
	return opt, nil, nil
}

// checkTLS rejects combinations of TLS flags that cannot work.
func (f connFlags) checkTLS() error {
	switch {
	case f.tlsCert != "" && f.tlsKey == "":
		return fail(exitUsage, "--tls-cert needs --tls-key (the client certificate's private key)")
	case f.tlsKey != "" && f.tlsCert == "":
		return fail(exitUsage, "--tls-key needs --tls-cert (the client certificate)")
	case f.tlsInsecure && f.tlsCA != "":
		return fail(exitUsage, "--tls-insecure and --tls-ca exclude each other: --tls-insecure skips the verification --tls-ca is for")
	}
	return nil
}

// tlsFlag returns the name of the first TLS flag set, or "".
func (f connFlags) tlsFlag() string {
	switch {
	case f.tlsCA != "":
		return "--tls-ca"
	case f.tlsCert != "":
		return "--tls-cert"
	case f.tlsInsecure:
		return "--tls-insecure"
	}
	return ""
}

// applyTLS reads the TLS files into conf, the TLS configuration parsed
// from the URL (nil for a plain-text URL).
func (f connFlags) applyTLS(conf *tls.Config) error {
	flag := f.tlsFlag()
	if flag == "" {
		return nil
	}
	if conf == nil {
		return fail(exitUsage, "%s needs a rediss:// URL: the --redis URL is plain text", flag)
	}
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return fail(exitUsage, "--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fail(exitUsage, "--tls-ca %s: no PEM certificate in it", f.tlsCA)
		}
		conf.RootCAs = pool
	}
	if f.tlsCert != "" {
		certPEM, err := os.ReadFile(f.tlsCert)
		if err != nil {
			return fail(exitUsage, "--tls-cert: %v", err)
		}
		keyPEM, err := os.ReadFile(f.tlsKey)
		if err != nil {
			return fail(exitUsage, "--tls-key: %v", err)
		}
		// X509KeyPair's errors are fixed texts: they never quote the key.
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return fail(exitUsage, "--tls-cert %s and --tls-key %s: %v", f.tlsCert, f.tlsKey, err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	if f.tlsInsecure {
		conf.InsecureSkipVerify = true
	}
	return nil
}

// connect returns a new client, checked with PING; the caller closes it.
func (d *dialer) connect(ctx context.Context) (redis.UniversalClient, error) {
	var rdb redis.UniversalClient
	if d.cluster != nil {
		rdb = redis.NewClusterClient(d.cluster)
	} else {
		rdb = redis.NewClient(d.single)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", pingTimeout)
		}
		return nil, fail(exitError, "redis unreachable at %s: %v%s", d.shown, err, d.tlsHint(err))
	}
	return rdb, nil
}

// tlsHint returns advice for an error that TLS explains, or "".
func (d *dialer) tlsHint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	switch {
	case d.tlsConfig() == nil && errors.Is(err, io.EOF):
		return " (the server closed the connection: if it requires TLS, use a rediss:// URL)"
	case errors.As(err, &unknownCA):
		return " (give the CA that signed the server's certificate with --tls-ca)"
	case strings.Contains(err.Error(), "tls: certificate required"):
		return " (the server requires a client certificate: give --tls-cert and --tls-key)"
	}
	return ""
}

// schemePrefix matches a URL scheme and "://".
var schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// passwordParam matches a password query parameter and its value.
var passwordParam = regexp.MustCompile(`(?i)([?&]password=)[^&#]*`)

// redactURL returns rawURL with its credentials replaced by "xxxxx". It
// works on the text, so it also redacts URLs that do not parse: everything
// between "://" and the last "@" is user information (a password may hold
// an unescaped @ / ? or #); its part after the first ":" is the password,
// and user information without ":" is redacted whole, as redis-cli reads
// it as a password. A password= query parameter is redacted too.
func redactURL(rawURL string) string {
	scheme := schemePrefix.FindString(rawURL)
	rest := rawURL[len(scheme):]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		if hasPassword {
			rest = user + ":" + redacted + rest[at:]
		} else {
			rest = redacted + rest[at:]
		}
	}
	return scheme + passwordParam.ReplaceAllString(rest, "${1}"+redacted)
}

// wrongType reports whether err is Redis's WRONGTYPE error.
func wrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// checkStream returns a not-found error (exit 4) if key does not exist and a
// wrong-type error (exit 1) if it is not a stream.
func checkStream(ctx context.Context, rdb redis.UniversalClient, key string) error {
	ok, err := streamExists(ctx, rdb, key)
	if err == nil && !ok {
		return fail(exitNotFound, "unknown stream %q", key)
	}
	return err
}

// streamExists reports whether key is a stream; it returns a wrong-type
// error (exit 1) if key is another type.
func streamExists(ctx context.Context, rdb redis.UniversalClient, key string) (bool, error) {
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		return false, fail(exitError, "type of %s: %w", key, err)
	}
	switch typ {
	case "stream":
		return true, nil
	case "none":
		return false, nil
	default:
		return false, fail(exitError, "wrong key type: %q is a %s, not a stream", key, typ)
	}
}

// withClient connects, runs fn and closes the client.
func withClient(ctx context.Context, a *app, fn func(rdb redis.UniversalClient) error) error {
	rdb, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	return fn(rdb)
}

// clusterHosts rewrites "redis://h1:p1,h2:p2/?q" to the form
// redis.ParseClusterURL takes: "redis://h1:p1/?q&addr=h2:p2".
func clusterHosts(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	hostEnd := strings.IndexAny(rest, "/?")
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	userHosts, tail := rest[:hostEnd], rest[hostEnd:]
	userinfo := ""
	if i := strings.LastIndex(userHosts, "@"); i >= 0 {
		userinfo, userHosts = userHosts[:i+1], userHosts[i+1:]
	}
	hosts := strings.Split(userHosts, ",")
	if len(hosts) < 2 {
		return rawURL
	}
	path, query, _ := strings.Cut(tail, "?")
	var extra []string
	for _, h := range hosts[1:] {
		if h != "" {
			extra = append(extra, "addr="+url.QueryEscape(h))
		}
	}
	if query != "" {
		extra = append([]string{query}, extra...)
	}
	return scheme + "://" + userinfo + hosts[0] + path + "?" + strings.Join(extra, "&")
}

// quietLogger drops go-redis's internal log lines (dial retries), which
// would clutter the command's output; errors are reported by pelican.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietLogger{}) }
