// Package stream defines Pelican's wire format and its producer: the first
// stage of the pipeline.
//
//	producer (this package) → Redis stream → consumer → middleware → handler
//
// A job is one Redis stream entry of flat field/value pairs. The format is a
// versioned contract (version 1, documented in docs/wire-format.md) so that any
// program with a plain Redis client can enqueue a job with nothing but XADD:
//
//	XADD jobs * type email.send payload '{"to":"a@example.com"}'
//
// [Encode] and [Decode] convert between a [Job] and entry fields. Decode never
// panics on foreign input; an entry it cannot accept yields a [*DecodeError]
// naming the field, and the consumer dead-letters such an entry with its raw
// fields intact.
//
// [Producer] adds jobs with XADD, one at a time or many in one round trip.
// With [ProducerConfig].EnqueueOnce it adds a job with an idempotency key
// at most once within a window, by one script that sets a marker
// ([Keys].Once) with the XADD; a repeat adds nothing and gets the first
// job's IDs, so retrying an enqueue whose outcome is unknown is safe.
// [TrimAcked] removes entries that every consumer group has read and
// acknowledged, and never an entry that is unread or pending.
//
// Keys: every key Pelican derives from a stream name ([KeysFor]) shares the
// stream's Redis Cluster hash slot, so the consumer's scripts run unchanged on
// Redis Cluster. KeysFor is the one place that names them: the queue's own
// keys (dead letters, delayed jobs, crash counters) and the namespaces the
// middleware use by default for locks, idempotency records and limits, so
// that two queues never share those unless configured to.
//
// Partitioned queues: [Partitions] names the n streams of one logical queue,
// with hash tags chosen to fall into n equal ranges of the cluster slots, so
// that one queue spreads over every master of a Redis Cluster;
// [PartitionOf] routes a key (CRC-32 mod n), and [PartitionedProducer]
// adds each job to its partition. Each partition is a queue of its own for
// everything else (docs/scaling.md).
//
// This package imports neither the consumer nor any observability library.
package stream
