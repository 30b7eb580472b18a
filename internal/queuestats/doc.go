// Package queuestats reads the state of Pelican queues for the operator's
// tools: the pelican command and the web dashboard share it, so both show
// the same numbers for the same Redis.
//
// [Scan] lists the streams of a database (every master of a cluster), and
// [Collect] reads many queues in two pipelined round trips whatever their
// number: the first reads each stream's length, groups, delayed set,
// dead-letter length and the reasons of its newest dead letters (counted in
// Redis by reasons.lua over at most Options.ReasonScan entries, so no
// payload is sent); the second reads each group's oldest pending entry and
// its consumers. Nothing walks a whole stream.
//
// It imports stream and go-redis only.
package queuestats
