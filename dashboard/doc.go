// Package dashboard is Pelican's web dashboard: an http.Handler that shows
// every queue and operates its dead letters and delayed jobs, for a service
// to mount under any prefix or for pelican web to serve on its own.
//
//	mux.Handle("/jobs/", http.StripPrefix("/jobs", dash))
//
// Pages are rendered on the server with html/template (every value escaped
// for its context), and every asset is embedded: one stylesheet and one
// small script (auto-refresh); nothing is loaded from elsewhere, and the
// Content-Security-Policy forbids inline scripts. The prefix is found from
// the request (what http.StripPrefix removed), so links need no setting.
//
// Pages:
//   - Overview (/): each queue with length, lag, pending, oldest pending
//     age, delayed, dead letters by reason, consumers, and enqueue and
//     completion rates charted from samples the dashboard takes itself.
//   - Queue (/queues/{stream}): groups, consumers, stuck jobs (pending for
//     more than Config.StuckAfter, with owner and delivery count), delayed
//     jobs with their due time, recent entries.
//   - Dead letters (/queues/{stream}/dead): the filters of package dlq
//     (type, reason, time range, error text), paging, and a job view with
//     every field, the payload decoded to JSON (msgpack too), the error
//     history and the trace ID (a link with Config.TraceURL).
//
// Partitioned queues (stream.Partitions) named in Config.Partitions are one
// queue each: one overview row with figures summed over the partitions (a
// partition never written to counts as empty), a queue page with a
// per-partition breakdown (each partition keeps its own page), and one
// dead-letter list of every partition (dlq.Partitioned: in the queue's
// order, paged by position <entry ID>@<partition>, which also names an
// entry in URLs since IDs repeat across partitions). Replay and purge act
// on every partition, each job back to the partition it died in.
//
// Pauses (package control) are shown on the overview and the queue page:
// the whole queue's or each type's, with its end; pause (the queue or a
// type, for a while or until resumed) and resume are actions like the
// others, on every partition of a partitioned queue. A pause hash of more
// than 2·control.MaxPauses fields (not Pelican's) is reported, not read.
//
// Actions: replay (filtered, rate-limited, in the background with its
// progress on the page, resumable, one at a time per dead-letter stream as
// package dlq enforces), purge, delete one dead letter, and run a delayed
// job now. Each is a POST carrying a CSRF token (double submit: a cookie and
// a form field that must match), also refused when the browser says it is
// cross-origin, and each asks first on a confirmation page that states how
// many jobs it touches; replay then moves at most that many. Every
// dead-letter operation is package dlq's. Config.ReadOnly hides them and
// refuses every POST.
//
// Cost on a big Redis: the overview reads all its queues in two pipelined
// round trips (package internal/queuestats); dead letters are counted by
// reason in Redis over each queue's newest Config.ReasonScan, and the page
// says when more exist; lists are capped at Config.PageSize. Nothing walks a
// whole stream except an action's confirmation, which counts the dead
// letters that match its filter. The list of streams comes from SCAN, reused
// for Config.StreamsTTL, unless Config.Streams names them.
//
// Authorization is the host's: Config.Authorize sees every request first.
// pelican web adds basic auth or a bearer token from its environment.
//
// This package imports control, dlq, stream and internal helpers; nothing in
// Pelican imports it but cmd/pelican.
package dashboard
