package pelicantest

import (
	"context"
	"fmt"
	"strings"

	"github.com/pelicanqueue/pelican/stream"
	"github.com/redis/go-redis/v9"
)

// Matcher selects jobs for [RequireEnqueued].
type Matcher func(*stream.Job) bool

// Type matches jobs of type typ.
func Type(typ string) Matcher { return func(j *stream.Job) bool { return j.Type == typ } }

// RequireEnqueued returns the first job of streamName, oldest first, that
// match accepts: an entry of the stream, or else a job waiting in its
// delayed set (a retry, EnqueueIn, EnqueueAt). It fails the test when there
// is none, listing the types and IDs of the jobs it found (never their
// payloads).
func RequireEnqueued(t TB, rdb redis.UniversalClient, streamName string, match Matcher) *stream.Job {
	t.Helper()
	jobs, err := Jobs(context.Background(), rdb, streamName)
	if err != nil {
		t.Fatalf("pelicantest: RequireEnqueued(%s): %v", streamName, err)
	}
	for _, j := range jobs {
		if match(j) {
			return j
		}
	}
	seen := make([]string, len(jobs))
	for i, j := range jobs {
		seen[i] = fmt.Sprintf("%s (job %s)", j.Type, j.ID)
	}
	if len(seen) == 0 {
		seen = append(seen, "none")
	}
	t.Fatalf("pelicantest: no matching job in %s; jobs there: %s", streamName, strings.Join(seen, ", "))
	return nil
}

// Jobs returns the jobs of streamName: its entries, oldest first, then the
// jobs of its delayed set, soonest first, each with Stream set.
func Jobs(ctx context.Context, rdb redis.UniversalClient, streamName string) ([]*stream.Job, error) {
	keys, err := stream.KeysFor(streamName)
	if err != nil {
		return nil, err
	}
	entries, err := rdb.XRange(ctx, streamName, "-", "+").Result()
	if err != nil {
		return nil, err
	}
	var out []*stream.Job
	for _, e := range entries {
		j, err := stream.Decode(e.ID, e.Values)
		if err != nil {
			return nil, fmt.Errorf("entry %s is not a valid job: %w", e.ID, err)
		}
		j.Stream = streamName
		out = append(out, j)
	}
	members, err := rdb.ZRange(ctx, keys.Delayed, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		_, fields, err := stream.DecodeDelayed(m)
		if err != nil {
			return nil, fmt.Errorf("a member of %s does not decode: %w", keys.Delayed, err)
		}
		j, err := decodeFields(fields)
		if err != nil {
			return nil, fmt.Errorf("a member of %s is not a valid job: %w", keys.Delayed, err)
		}
		j.Stream = streamName
		out = append(out, j)
	}
	return out, nil
}
