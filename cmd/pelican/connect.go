package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pingTimeout bounds the first PING to Redis.
const pingTimeout = 3 * time.Second

// connect returns a client for rawURL, checked with PING. A redis+cluster://
// URL, or cluster, makes a Cluster client; rediss:// uses TLS.
func connect(ctx context.Context, rawURL string, cluster bool) (redis.UniversalClient, error) {
	shown := redactURL(rawURL)
	var rdb redis.UniversalClient
	if strings.HasPrefix(rawURL, "redis+cluster://") || strings.HasPrefix(rawURL, "rediss+cluster://") {
		cluster = true
		rawURL = clusterHosts(strings.Replace(rawURL, "+cluster://", "://", 1))
	}
	if cluster {
		opt, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fail(exitUsage, "invalid --redis URL %s: %v", shown, err)
		}
		rdb = redis.NewClusterClient(opt)
	} else {
		opt, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fail(exitUsage, "invalid --redis URL %s: %v", shown, err)
		}
		opt.MaxRetries = 1
		rdb = redis.NewClient(opt)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", pingTimeout)
		}
		return nil, fail(exitError, "redis unreachable at %s: %v", shown, err)
	}
	return rdb, nil
}

// redactURL returns rawURL with any password replaced by "xxxxx".
func redactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
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
