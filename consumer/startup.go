package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// startup creates the consumer group and checks the Redis user's
// permissions, waiting for Redis as Config.StartTimeout says, then checks
// the eviction policy. It returns stopped when Run's context ended or
// Shutdown was called first (nothing has started, so there is nothing to
// drain), and an error when Redis refused in a way that waiting cannot fix,
// or did not answer in time.
//
// Each attempt runs in a goroutine of its own, so that a stop ends the wait
// even when Redis is a black hole: a command whose reply never comes returns
// only at the client's read timeout, whatever its context says, unless the
// client has ContextTimeoutEnabled. On a stop, startup cancels the attempt
// and waits abandonGrace for it, then leaves it: it only creates the group,
// which is idempotent, and ends at the client's timeouts.
func (c *Consumer) startup(ctx context.Context) (stopped bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var deadline <-chan time.Time
	if c.r.StartTimeout > 0 {
		t := time.NewTimer(c.r.StartTimeout)
		defer t.Stop()
		deadline = t.C
	}
	begin := time.Now()
	var (
		b       backoff
		lastErr error
	)
	// end cancels the attempt under way and gives it abandonGrace to return.
	end := func(attempt <-chan error) {
		cancel()
		grace := time.NewTimer(abandonGrace)
		defer grace.Stop()
		select {
		case <-attempt:
		case <-grace.C:
		}
	}
	timedOut := func() error {
		if lastErr == nil { // the first attempt has not answered
			return fmt.Errorf("consumer: Redis did not answer within Config.StartTimeout (%v)", c.r.StartTimeout)
		}
		return fmt.Errorf("%w; gave up after Config.StartTimeout (%v)", lastErr, c.r.StartTimeout)
	}
	for attempts := 1; ; attempts++ {
		attempt := make(chan error, 1)
		go func() { attempt <- c.tryStart(ctx) }()
		select {
		case err = <-attempt:
		case <-ctx.Done():
			end(attempt)
			return true, nil
		case <-c.stopReq:
			end(attempt)
			return true, nil
		case <-deadline:
			end(attempt)
			return false, timedOut()
		}
		switch {
		case ctx.Err() != nil:
			return true, nil
		case err == nil:
			if attempts > 1 {
				c.r.Logger.Info("Redis answered; starting", "stream", c.r.Stream, "group", c.r.Group,
					"consumer", c.r.Consumer, "waited_ms", time.Since(begin).Milliseconds())
			}
			return false, nil
		case !waitCanFix(err), c.r.StartTimeout < 0:
			return false, err
		}
		lastErr = err
		c.errLog.error("Redis is not available at start; waiting for it", err, "stream", c.r.Stream, "group", c.r.Group,
			"consumer", c.r.Consumer, "waited_ms", time.Since(begin).Milliseconds())
		pause := time.NewTimer(b.next())
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return true, nil
		case <-c.stopReq:
			pause.Stop()
			return true, nil
		case <-deadline:
			pause.Stop()
			return false, timedOut()
		}
	}
}

// tryStart creates the group, checks the user's permissions and the
// eviction policy. The group comes first: its simple command gets the plain
// NOAUTH or NOPERM reply when the client is not authenticated or may not
// create it, where the check's long command would get a protocol error (Redis
// refuses long commands from unauthenticated clients).
func (c *Consumer) tryStart(ctx context.Context) error {
	if err := c.createGroup(ctx, c.r.StartID); err != nil {
		return err
	}
	if err := c.checkVersion(ctx); err != nil {
		return err
	}
	if err := c.checkPermissions(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		c.checkEviction(ctx)
	}
	return nil
}

// fatalReplies are the error replies to XGROUP CREATE that waiting cannot
// fix: a stream key holding another type, refused credentials or
// permissions, a server without the command (older than Redis 5, or the
// command renamed). The configuration (StartID) is checked before Run sends
// anything.
var fatalReplies = []string{"WRONGTYPE", "NOAUTH", "WRONGPASS", "NOPERM", "ERR unknown command", "ERR unknown subcommand"}

// waitCanFix reports whether err, from an attempt to start, may go away if
// Run waits: a network error, a timeout, or an error reply other than
// fatalReplies (LOADING, READONLY, MASTERDOWN, CLUSTERDOWN, OOM, too many
// clients). A closed client never reopens, and permissions denied stay
// denied.
func waitCanFix(err error) bool {
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, errPermission) || errors.Is(err, errVersion) {
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	for _, prefix := range fatalReplies {
		if strings.HasPrefix(reply.Error(), prefix) {
			return false
		}
	}
	return true
}
