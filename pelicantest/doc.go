// Package pelicantest tests Pelican handlers the way they run in production:
// through a real [consumer.Consumer], the application's own middleware chain
// and a Redis, in one call.
//
//	r := pelicantest.NewRedis(t)                // embedded, or $PELICAN_TEST_REDIS
//	res := pelicantest.Run(t, handler, job,
//		pelicantest.WithRedis(r),
//		pelicantest.WithMiddleware(middleware.Retry(policy)))
//	if res.Outcome != pelicantest.Retried || res.Delay != time.Minute { ... }
//	pelicantest.RequireEnqueued(t, r.Client, r.Name("emails"), pelicantest.Type("email.send"))
//
// [Run] enqueues the job, runs a consumer until the job's delivery has
// settled, shuts the consumer down and reports what happened: the [Outcome]
// (done, retried, snoozed, dead) read back from Redis, the delay and the
// rescheduled job of a retry or snooze, the dead-letter reason, the error
// the chain returned, and every job the handler enqueued or scheduled.
//
// [NewRedis] gives each test its own Redis: an in-process miniredis by
// default (no server to install; see the README's Embedded mode for what it
// does not reproduce), or, when the environment variable PELICAN_TEST_REDIS
// holds a redis:// URL, that server, with every key the test uses under a
// namespace of its own ([Redis.Name]) that is deleted when the test ends.
// Reliability properties (leases, crash isolation, trimming) are Redis
// properties: run the suite against a real server in CI.
//
// [Redis.Advance] moves Redis's side of time forward without sleeping:
// delayed jobs fall due, pending entries age past the visibility timeout so
// that the next sweep reclaims them, and keys' time to live runs down (locks,
// idempotency leases).
//
// Functions that take a [TB] fail the test with Fatalf; call them from the
// test's goroutine. A *testing.T or *testing.B is a TB.
package pelicantest
