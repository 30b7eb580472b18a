// Package redistest starts real redis-server processes for integration tests.
//
// It is the "real Redis" part of the fault-matrix harness: tests in stream,
// consumer, claim, lockx, idem and integration import it to get a private
// Redis they may kill (Server.Kill9), freeze (Server.Stop, Server.Cont),
// shut down and restart (Server.Shutdown, Server.Restart), or a local Redis
// Cluster (StartCluster) to check that every script keeps its keys in one
// slot, with replicas (StartClusterReplicas) whose masters a test kills
// and waits for a replica to take over (Cluster.KillMaster), or a TLS-only server (Options.TLS) with a CA and certificates it
// makes itself. Shared and Addr reach the long-lived
// Redis named by REDIS_ADDR, for tests that do not need a private server;
// Name gives each test its own key prefix, so such tests never FLUSHDB.
//
// For a busy machine: StallWatch measures the times a process (and Redis)
// did not run, and Widen repeats a scenario with wider timings when a run
// measured that the machine broke its preconditions, so that a test fails
// only when the product is wrong.
//
// Invariants:
//   - Every server listens on 127.0.0.1 only, on a free port, with its data
//     directory and log (redis.log) in t.TempDir().
//   - Processes are started with os/exec (never --daemonize), in their own
//     process group, so their PID is known; t.Cleanup kills the whole group
//     with SIGKILL and reaps it, whether the test passed or failed. On Linux
//     the servers also get SIGKILL if the test binary dies without running
//     its cleanups (for example on a go test -timeout panic).
//   - Readiness is decided by polling PING (and checking that the server that
//     answered is ours, by its process_id) against a deadline; a LOADING reply
//     is not ready. There are no fixed sleeps.
//   - Functions that take a testing.TB, and the methods of Server and Cluster,
//     fail the test with t.Fatalf, so call them from the test's goroutine.
//
// redistest is internal: it is imported only by tests, and imports nothing
// from Pelican. It needs redis-server and redis-cli (7.0 or later) on PATH.
package redistest
