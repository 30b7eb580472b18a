package middleware

import (
	"fmt"
	"sync/atomic"

	"github.com/pelicanqueue/pelican/stream"
)

// namespace returns the key prefix under which a middleware keeps job's
// keys (locks, idempotency records, rate and concurrency limits): prefix
// when it is set, shared by every queue whose middleware uses the same
// prefix, else the prefix that field picks from the keys of the job's own
// queue (stream.KeysFor(job.Stream)), such as "{orders}:lock:": one
// namespace per queue, in the stream's cluster slot. stream.KeysFor is the
// one place that names those keys.
func namespace(prefix string, job *stream.Job, field func(stream.Keys) string) (string, error) {
	if prefix != "" {
		return prefix, nil
	}
	keys, err := stream.KeysFor(job.Stream)
	if err != nil {
		return "", fmt.Errorf("middleware: job.Stream (%q) names no queue to keep its keys in (set the Prefix of the middleware's config to share one across queues): %w", job.Stream, err)
	}
	return field(keys), nil
}

// nsCache remembers the namespace of the last stream a middleware saw, so
// that a consumer's jobs (all of one stream) do not derive every key of
// their queue again per job.
type nsCache struct {
	last atomic.Pointer[nsEntry]
}

type nsEntry struct{ stream, ns string }

// get returns namespace(prefix, job, field), from the cache when job's
// stream is the last one seen.
func (c *nsCache) get(prefix string, job *stream.Job, field func(stream.Keys) string) (string, error) {
	if prefix != "" {
		return prefix, nil
	}
	if e := c.last.Load(); e != nil && e.stream == job.Stream {
		return e.ns, nil
	}
	ns, err := namespace(prefix, job, field)
	if err == nil {
		c.last.Store(&nsEntry{stream: job.Stream, ns: ns})
	}
	return ns, err
}
