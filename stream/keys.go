package stream

import (
	"fmt"
	"strings"
)

// Keys are the Redis keys of one queue. All of them hash to the stream's
// Redis Cluster slot, so a script may use any of them together.
type Keys struct {
	// Stream is the job stream itself.
	Stream string
	// Dead is the default dead-letter stream.
	Dead string
	// Delayed is the sorted set of jobs waiting for a later attempt.
	Delayed string
	// Crashes is the prefix of the crash counters of redelivered jobs (see
	// consumer.Config.MaxCrashes): Crashes + group + ":" + job ID (the entry
	// ID when the job has none; a SHA-256 when the ID is over 128 bytes) is a
	// string key with a time to live.
	Crashes string
	// Once is the prefix of the queue's enqueue-once markers (see
	// [ProducerConfig].EnqueueOnce): the marker of idempotency key k is
	// Once + k, a string "<entry id> <job id>" with the window as its time
	// to live.
	Once string
	// Idem is the prefix of the queue's idempotency records, the default of
	// middleware.IdempotencyConfig.Prefix: the record of idempotency key k
	// is Idem + k.
	Idem string
	// Lock is the prefix of the queue's locks, the default of
	// middleware.LockConfig.Prefix: the lock of key k is
	// Lock + "{" + k + "}", one key holding the lock's fence and token (and
	// the fence alone for the lock's TTL after release; see package lockx).
	Lock string
	// Rate is the prefix of the queue's rate limits, the default of
	// middleware.RateLimitConfig.Prefix: the limiter of key k is Rate + k.
	Rate string
	// Limit is the prefix of the queue's distributed concurrency limits,
	// the default of middleware.DistributedConcurrencyConfig.Prefix: the
	// slots of key k are Limit + k.
	Limit string
	// Periodic is the prefix of the keys of package periodic's schedules:
	// Periodic + "last" is a hash of each schedule's last enqueued tick
	// (field: schedule name, value: the tick's Unix time in milliseconds),
	// and Periodic + "tick:" + name + ":" + tick ms is the marker of one
	// tick, a string holding the tick's entry ID with a time to live.
	Periodic string
	// Paused is the hash of the queue's pauses (see package control): field
	// "queue" pauses the whole queue, "type:" + t the jobs of type t; each
	// value is the pause's end in Unix milliseconds of the Redis clock, "0"
	// for none.
	Paused string
	// Control is the Pub/Sub channel on which package control tells the
	// queue's consumers that its pauses changed. A channel, not a key: a
	// Redis ACL covers it with "&{orders}:*".
	Control string
	// Job is the prefix of the index records of tracked jobs (see
	// [Job].Track): the record of job ID id is Job + id (a "sha1:" and
	// the SHA-1 of the ID in hex when the ID is over 128 bytes; see
	// [JobKey]), a string that says where the job is now.
	Job string
}

// KeysFor returns the keys of the queue whose stream is named stream.
//
// A derived key is the stream name with a suffix when the name already has a
// hash tag ("{orders}:jobs" → "{orders}:jobs:dlq"), and otherwise the name
// wrapped in a hash tag ("orders" → "{orders}:dlq"): either way Redis Cluster
// hashes it like the stream. A name with braces that form no hash tag cannot
// share its slot with any derived key, and is rejected.
//
// The keys of queue "orders" are the stream "orders" and keys that start
// with "{orders}:" (a Redis ACL of "~orders ~{orders}:*" covers them all):
//
//	{orders}:dlq            dead-letter stream
//	{orders}:delayed        jobs waiting for a later attempt
//	{orders}:crashes:<group>:<job id>   crash counters of redelivered jobs
//	{orders}:once:<key>     enqueue-once markers
//	{orders}:idem:<key>     idempotency records
//	{orders}:lock:{<key>}   locks (each with its fencing token)
//	{orders}:rate:<key>     rate limits
//	{orders}:limit:<key>    distributed concurrency limits
//	{orders}:periodic:last  the last enqueued tick of each periodic schedule
//	{orders}:periodic:tick:<name>:<tick ms>   per-tick markers of periodic schedules
//	{orders}:paused         pauses (package control)
//	{orders}:control        the Pub/Sub channel of pause changes
//	{orders}:job:<job id>   index records of tracked jobs (control.Lookup)
//
// Dead-letter replays add {orders}:dlq:replay and {orders}:dlq:replay:cursor
// (the dead-letter stream's derived keys). Locks, idempotency records and
// limits are per queue by default, so that two queues using the same keys
// ("invoice-1") never meet; a middleware given an explicit prefix shares
// them with every queue that uses the same prefix.
func KeysFor(stream string) (Keys, error) {
	prefix, err := tagPrefix(stream)
	if err != nil {
		return Keys{}, err
	}
	return Keys{
		Stream:   stream,
		Dead:     prefix + ":dlq",
		Delayed:  prefix + ":delayed",
		Crashes:  prefix + ":crashes:",
		Once:     prefix + ":once:",
		Idem:     prefix + ":idem:",
		Lock:     prefix + ":lock:",
		Rate:     prefix + ":rate:",
		Limit:    prefix + ":limit:",
		Periodic: prefix + ":periodic:",
		Paused:   prefix + ":paused",
		Control:  prefix + ":control",
		Job:      prefix + ":job:",
	}, nil
}

// DerivedKey returns stream's key with the given suffix, in the stream's
// cluster slot, as [KeysFor] builds its keys.
func DerivedKey(stream, suffix string) (string, error) {
	prefix, err := tagPrefix(stream)
	if err != nil {
		return "", err
	}
	return prefix + ":" + suffix, nil
}

func tagPrefix(stream string) (string, error) {
	if stream == "" {
		return "", fmt.Errorf("stream: empty stream name")
	}
	if strings.Contains(stream, "~") {
		// '~' appears only in the names of partitions, exactly as
		// Partitions makes them, and in the names of their keys
		// ("<partition>:<suffix>", a dead-letter stream say), so that a
		// Redis ACL pattern "~{orders~*" covers the keys of queue orders's
		// partitions and nothing else.
		p, rest, _ := strings.Cut(stream, "}")
		if _, _, _, ok := ParsePartition(p + "}"); !ok || rest != "" && (rest[0] != ':' || strings.Contains(rest, "~")) {
			return "", fmt.Errorf("stream: name %.64q has '~': '~' is reserved for the names of partitions, exactly as Partitions makes them, and of their keys", stream)
		}
		return stream, nil
	}
	if s := strings.IndexByte(stream, '{'); s >= 0 {
		if e := strings.IndexByte(stream[s+1:], '}'); e > 0 {
			return stream, nil // has a hash tag: suffixes keep it
		}
	}
	if strings.ContainsAny(stream, "{}") {
		return "", fmt.Errorf("stream: name %.64q has braces that form no hash tag; use a name without braces or with a non-empty {tag}", stream)
	}
	return "{" + stream + "}", nil
}
