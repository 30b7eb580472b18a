package stream

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/internal/keyslot"
)

// Partitioned queues: one logical queue spread over n streams, each with a
// hash tag of its own, chosen so that the streams fall into n equal ranges
// of the 16,384 Redis Cluster slots and so spread over the cluster's
// masters. The layout and the routing rule are a documented contract
// (docs/wire-format.md, "Partitioned queues"), so that producers in any
// language compute the same streams.

// MaxPartitions is the largest partition count [Partitions] accepts.
const MaxPartitions = 1024

// maxSuffix bounds the search for a partition's suffix. With ranges of at
// least 16 slots (MaxPartitions), the suffix found is below about a
// hundred times the partition count; the bound only makes the search
// finite.
const maxSuffix = 1 << 22

// Partitions returns the stream names of the n partitions of queue, in
// partition order. Partition i is the stream
//
//	{<queue>~<n>~<i>~<k>}
//
// where k is the smallest non-negative integer (in decimal) for which the
// name's hash tag, <queue>~<n>~<i>~<k>, has a Redis Cluster slot (CRC16
// XMODEM mod 16384) in the i-th of n equal slot ranges, [i·16384/n,
// (i+1)·16384/n) with integer division. The result is deterministic and
// depends only on queue and n, so every client computes the same names;
// [KeysFor] of each name gives the partition's own dead letters, delayed
// set, locks and idempotency records ({orders~12~0~43}:dlq, ...).
//
// queue must be non-empty, without '{', '}' or '~', and n between 1 and
// [MaxPartitions].
func Partitions(queue string, n int) ([]string, error) {
	if err := checkPartitioned(queue, n); err != nil {
		return nil, err
	}
	names := make([]string, n)
	for i := range n {
		name, err := partition(queue, n, i)
		if err != nil {
			return nil, err
		}
		names[i] = name
	}
	return names, nil
}

// PartitionStream returns the stream of partition i of queue's n
// partitions: Partitions(queue, n)[i], computed alone.
func PartitionStream(queue string, n, i int) (string, error) {
	if err := checkPartitioned(queue, n); err != nil {
		return "", err
	}
	if i < 0 || i >= n {
		return "", fmt.Errorf("stream: partition %d out of range [0, %d)", i, n)
	}
	return partition(queue, n, i)
}

// PartitionOf returns the partition of a job routed by key among n
// partitions: the CRC-32 (IEEE, as zlib.crc32 and Java's CRC32 compute it)
// of key's bytes modulo n. The same key always goes to the same partition
// for a given n; it returns 0 when n is less than 2.
func PartitionOf(key string, n int) int {
	if n < 2 {
		return 0
	}
	return int(uint64(crc32.ChecksumIEEE([]byte(key))) % uint64(n))
}

// ParsePartition reports whether name is a partition stream as
// [Partitions] names them, and if so of which queue, partition count and
// index. It checks the suffix too, so a name that merely looks like one is
// not taken for a partition.
func ParsePartition(name string) (queue string, n, i int, ok bool) {
	if len(name) < 2 || name[0] != '{' || name[len(name)-1] != '}' {
		return "", 0, 0, false
	}
	parts := strings.Split(name[1:len(name)-1], "~")
	if len(parts) != 4 { // a queue name has no '~'
		return "", 0, 0, false
	}
	n, err1 := strconv.Atoi(parts[1])
	i, err2 := strconv.Atoi(parts[2])
	queue = parts[0]
	if err1 != nil || err2 != nil || queue == "" {
		return "", 0, 0, false
	}
	want, err := PartitionStream(queue, n, i)
	if err != nil || want != name {
		return "", 0, 0, false
	}
	return queue, n, i, true
}

func checkPartitioned(queue string, n int) error {
	if queue == "" {
		return errors.New("stream: empty queue name")
	}
	if strings.ContainsAny(queue, "{}") {
		return fmt.Errorf("stream: queue name %.64q must not contain braces: each partition has a hash tag of its own", queue)
	}
	if strings.Contains(queue, "~") {
		return fmt.Errorf("stream: queue name %.64q must not contain '~': it separates the parts of a partition's name, and the ACL pattern ~{<queue>~* of one queue would cover another's keys", queue)
	}

	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("stream: partition count %d must be between 1 and %d", n, MaxPartitions)
	}
	return nil
}

func partition(queue string, n, i int) (string, error) {
	lo, hi := i*keyslot.Slots/n, (i+1)*keyslot.Slots/n
	base := queue + "~" + strconv.Itoa(n) + "~" + strconv.Itoa(i) + "~"
	for k := range maxSuffix {
		tag := base + strconv.Itoa(k)
		if s := keyslot.Of(tag); s >= lo && s < hi {
			return "{" + tag + "}", nil
		}
	}
	return "", fmt.Errorf("stream: no suffix below %d puts partition %d of %.64q in slots [%d, %d)", maxSuffix, i, queue, lo, hi)
}

// PartitionedProducerConfig configures a [PartitionedProducer].
type PartitionedProducerConfig struct {
	// Key returns the partition key of a job: jobs with the same key go to
	// the same partition ([PartitionOf]), so they keep the order in which
	// they were added as far as one stream keeps it; a job for which it
	// returns "" goes to the partition of its job ID (given a new UUIDv7
	// first when empty), so the same job always goes to the same
	// partition (scheduling it again moves it) and jobs without a key
	// spread evenly. The partition's idempotency records, enqueue-once
	// markers and locks are the partition's own ([KeysFor]): route every
	// job of an idempotency key (and of a lock key, if locks must exclude
	// each other) to one partition, as the default does. Defaults to
	// Producer.OnceKey when that is set, else the job's IdempotencyKey.
	Key func(job *Job) string
	// Partitions is the number of partitions, between 1 and
	// [MaxPartitions]. Required.
	Partitions int
	// Producer configures each partition's [Producer]; its Stream must be
	// empty (each partition's stream is set from Queue). Defaults to the
	// zero ProducerConfig.
	Producer ProducerConfig
	// Queue is the logical queue's name: non-empty, without braces or '~'.
	// Required.
	Queue string
}

// Validate reports the first problem with cfg, naming the field, without
// touching Redis.
func (cfg PartitionedProducerConfig) Validate() error {
	if cfg.Queue == "" {
		return errors.New("stream: PartitionedProducerConfig.Queue is required")
	}
	if err := checkPartitioned(cfg.Queue, cfg.Partitions); err != nil {
		if cfg.Partitions < 1 || cfg.Partitions > MaxPartitions {
			return fmt.Errorf("stream: PartitionedProducerConfig.Partitions (%d) must be between 1 and %d", cfg.Partitions, MaxPartitions)
		}
		return fmt.Errorf("stream: PartitionedProducerConfig.Queue: %w", err)
	}
	if cfg.Producer.Stream != "" {
		return fmt.Errorf("stream: PartitionedProducerConfig.Producer.Stream (%.64q) must be empty: partitions are named from Queue", cfg.Producer.Stream)
	}
	pc := cfg.Producer
	pc.Stream, _ = partition(cfg.Queue, cfg.Partitions, 0)
	if err := pc.Validate(); err != nil {
		return fmt.Errorf("stream: PartitionedProducerConfig.Producer: %w", err)
	}
	return nil
}

// PartitionedProducer adds jobs to the partitions of one logical queue
// (see [Partitions]), each job to the partition of its key or, without a
// key, to the partition of its job ID. Each partition is written by its own
// [Producer], so everything said there (outcomes of errors, enqueue once,
// scheduling) holds per partition. It is safe for concurrent use.
type PartitionedProducer struct {
	cfg   PartitionedProducerConfig
	names []string
	parts []*Producer
}

// NewPartitionedProducer returns a producer for cfg's queue. It returns
// cfg.Validate's error, before any command is sent.
func NewPartitionedProducer(rdb redis.UniversalClient, cfg PartitionedProducerConfig) (*PartitionedProducer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	names, err := Partitions(cfg.Queue, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	p := &PartitionedProducer{cfg: cfg, names: names}
	for _, name := range names {
		pc := cfg.Producer
		pc.Stream = name
		p.parts = append(p.parts, NewProducer(rdb, pc))
	}
	return p, nil
}

// Streams returns the partitions' stream names, in partition order.
func (p *PartitionedProducer) Streams() []string { return append([]string(nil), p.names...) }

// Route returns the partition job goes to: [PartitionOf] its key, or of
// its job ID when it has no key (a job without an ID is given one, as
// Enqueue would). The same job always routes to the same partition. A nil
// job routes to partition 0.
func (p *PartitionedProducer) Route(job *Job) int {
	if job == nil {
		return 0
	}
	var key string
	switch {
	case p.cfg.Key != nil:
		key = p.cfg.Key(job)
	case p.cfg.Producer.OnceKey != nil:
		key = p.cfg.Producer.OnceKey(job)
	default:
		key = job.IdempotencyKey
	}
	if key == "" {
		if err := p.parts[0].ensureID(job); err != nil {
			return 0 // crypto/rand failed; Enqueue reports it
		}
		key = job.ID
	}
	return PartitionOf(key, len(p.parts))
}

// Enqueue adds job to its partition ([PartitionedProducer.Route]) and
// returns the partition's stream and the new entry's ID, as
// [Producer.Enqueue] does.
func (p *PartitionedProducer) Enqueue(ctx context.Context, job *Job) (stream, id string, err error) {
	if job == nil {
		return "", "", errors.New("stream: job is nil")
	}
	i := p.Route(job)
	id, err = p.parts[i].Enqueue(ctx, job)
	return p.names[i], id, err
}

// EnqueueBatch adds jobs, each to its partition, with one
// [Producer.EnqueueBatch] per partition involved, sent concurrently, and
// returns each job's entry ID in order ("" for a job not added; its
// partition is Streams()[Route]). The error joins the partitions' errors;
// as with Producer.EnqueueBatch, a job with an error may have been added.
func (p *PartitionedProducer) EnqueueBatch(ctx context.Context, jobs []*Job) ([]string, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	for i, j := range jobs {
		if j == nil {
			return nil, fmt.Errorf("stream: batch job %d is nil", i)
		}
	}
	groups := make(map[int][]int)
	for i, j := range jobs {
		part := p.Route(j)
		groups[part] = append(groups[part], i)
	}
	ids := make([]string, len(jobs))
	errs := make([]error, 0, len(groups))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for part, idx := range groups {
		wg.Go(func() {
			batch := make([]*Job, len(idx))
			for k, i := range idx {
				batch[k] = jobs[i]
			}
			got, err := p.parts[part].EnqueueBatch(ctx, batch)
			mu.Lock()
			defer mu.Unlock()
			for k, i := range idx {
				if k < len(got) {
					ids[i] = got[k]
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("partition %s: %w", p.names[part], err))
			}
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// EnqueueAt schedules job on its partition, as [Producer.EnqueueAt] does,
// and returns the partition's stream.
func (p *PartitionedProducer) EnqueueAt(ctx context.Context, job *Job, t time.Time) (string, error) {
	if job == nil {
		return "", errors.New("stream: job is nil")
	}
	i := p.Route(job)
	return p.names[i], p.parts[i].EnqueueAt(ctx, job, t)
}

// EnqueueIn schedules job on its partition after d by the Redis clock, as
// [Producer.EnqueueIn] does, and returns the partition's stream.
func (p *PartitionedProducer) EnqueueIn(ctx context.Context, job *Job, d time.Duration) (string, error) {
	if job == nil {
		return "", errors.New("stream: job is nil")
	}
	i := p.Route(job)
	return p.names[i], p.parts[i].EnqueueIn(ctx, job, d)
}
