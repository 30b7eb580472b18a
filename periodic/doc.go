// Package periodic enqueues periodic (cron) jobs with no leader: run a
// [Scheduler] in every process that should keep the schedules going
// (typically one per consumer process), and each tick's job is enqueued
// exactly once across all of them.
//
//	Scheduler (any number) ──tick.lua at each tick──▶ stream ──▶ consumer
//
// It is a leaf beside package outbox: it imports stream, never consumer.
//
// # Exactly one enqueue per tick
//
// At each tick every scheduler runs one script (tick.lua, one call per tick
// per scheduler, nothing in between) that, atomically and by the Redis
// clock (TIME inside the script):
//
//   - refuses the tick if it is early: no job is ever enqueued before its
//     tick, whatever the local clocks say (schedulers aim at the tick with
//     a lower bound of the offset to the Redis clock, which the reply of
//     every call corrects when it proves it wrong: a slow round trip on a
//     busy machine does not make a call early);
//   - refuses it if its marker {stream}:periodic:tick:<name>:<tick ms>
//     exists (another scheduler enqueued it), or if the schedule's record
//     (field <name> of the hash {stream}:periodic:last) holds this tick or a
//     later one;
//   - refuses it if it is past its tolerance ([Schedule].Tolerance: how late
//     a tick may still be enqueued; at most the time to the next tick, so at
//     most one tick of a schedule is ever open);
//   - otherwise adds the job (XADD), sets the marker (the entry ID, with a
//     time to live of the tolerance plus a minute) and raises the record.
//
// All three keys share the stream's hash slot. The marker and the record
// each prevent a second enqueue on their own: the record if a marker was
// evicted, the marker if a record was deleted. Memory stays bounded:
// markers expire, and there is one record per schedule name.
//
// # Jobs
//
// The job of the tick at time t has job_id and idempotency_key
// [JobID](name, t), "<name>@<t in UTC, RFC 3339 with milliseconds>"
// (nightly@2026-03-09T06:30:00.000Z), so the job, its retries and its dead
// letter are traceable to the tick, and middleware.Idempotency sees a
// tick's job once. Its type, payload, content type, headers, lock key and
// attempt limit come from the [Schedule]. Its entry ID's time, which is
// Redis time, is never before the tick.
//
// # Failures and missed ticks
//
// A Redis error in a tick is logged (bounded, never the payload) and the
// tick is retried, with a backoff from 100 ms to 5 s, until its tolerance
// ends; the scheduler never stops for an error. A tick that no scheduler
// enqueued within its tolerance is missed: it is logged, and the
// schedule's [Missed] policy decides. [Skip] (the default) goes on with the
// next tick. [RunOnce], when a scheduler starts or finds a tick missed,
// enqueues the latest tick that is due as a catch-up (late), once (the
// script checks the record is older), never one job per missed tick. A
// schedule that has no record yet (it never enqueued a tick) has nothing to
// catch up.
//
// # Deploys
//
// Schedules live in code: changing or removing one takes effect as the new
// code's schedulers start, and nothing is registered in Redis except the
// record of the last tick ([Records] lists them; a removed schedule's record
// stays until deleted). Schedules of different names never interact, so
// services that each register their own schedules do not fight. During a
// rolling deploy that changes a schedule under the same name, old and new
// schedulers both run: a tick that both definitions have is enqueued once,
// with the definition of whichever scheduler came first (its payload and
// options); ticks of only one definition are enqueued by the schedulers
// that have it; and a tick older than the record (a later tick of the other
// definition was already enqueued) is dropped. Rename a schedule to make a
// clean cut.
//
// # Time
//
// Every ticks at the multiples of its interval since the Unix epoch. Cron
// is parsed by github.com/robfig/cron/v3 (with an optional seconds field
// and descriptors, in [Schedule].Location or a CRON_TZ= prefix, UTC by
// default), which also defines daylight saving time: a time a
// spring-forward skips does not run that day ("30 2 * * *" in
// America/New_York has no tick on the second Sunday of March), and a time
// a fall-back repeats runs twice ("30 1 * * *" ticks at 01:30 EDT and at
// 01:30 EST on the first Sunday of November: two ticks, two jobs).
package periodic
