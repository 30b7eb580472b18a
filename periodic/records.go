package periodic

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/stream"
)

// Record is what Redis keeps of one schedule: its last enqueued tick.
type Record struct {
	// Name is the schedule's name.
	Name string
	// LastTick is the latest tick enqueued; zero if the record does not
	// hold a time (written by something else).
	LastTick time.Time
	// JobID is the job ID of the last tick ([JobID]); "" with a zero
	// LastTick.
	JobID string
}

// Records returns the records of every schedule that has enqueued a tick on
// streamName, sorted by name: one per schedule name ever used, including
// schedules since removed from the code (delete a removed schedule's record
// with HDEL on [stream.Keys].Periodic + "last"; a schedule without a record
// has no missed tick to catch up).
func Records(ctx context.Context, rdb redis.UniversalClient, streamName string) ([]Record, error) {
	keys, err := stream.KeysFor(streamName)
	if err != nil {
		return nil, fmt.Errorf("periodic: Records: %w", err)
	}
	m, err := rdb.HGetAll(ctx, keys.Periodic+"last").Result()
	if err != nil {
		return nil, fmt.Errorf("periodic: Records: %w", err)
	}
	out := make([]Record, 0, len(m))
	for name, v := range m {
		r := Record{Name: name}
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
			r.LastTick = time.UnixMilli(ms).UTC()
			r.JobID = JobID(name, r.LastTick)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
