package stream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

// On a real Redis: every path that adds a tracked job writes its record at
// stream.JobKey, for streams with and without a hash tag and for an ID
// over 128 bytes (hashed the same way in Go and in the scripts); an
// untracked job writes none.
func TestJobKey_recordsWritten(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	ctx := context.Background()
	base := redistest.Name(t)
	for _, name := range []string{base, "{" + base + "}:jobs"} {
		keys, err := stream.KeysFor(name)
		if err != nil {
			t.Fatal(err)
		}
		long := strings.Repeat("L", 200)
		jobs := map[string]*stream.Job{
			"enqueue": {Type: "t", ID: "a-" + name},
			"long":    {Type: "t", ID: long},
			"batch":   {Type: "t", ID: "b-" + name},
			"at":      {Type: "t", ID: "c-" + name},
			"longat":  {Type: "t", ID: long + "at"},
			"plain":   {Type: "t", ID: "d-" + name},
		}
		t.Cleanup(func() {
			rdb.Del(context.Background(), name, keys.Delayed)
			for _, j := range jobs {
				rdb.Del(context.Background(), stream.JobKey(keys, j.ID))
			}
		})
		p := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name, Track: true})
		for _, k := range []string{"enqueue", "long"} {
			if _, err := p.Enqueue(ctx, jobs[k]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.EnqueueBatch(ctx, []*stream.Job{jobs["batch"]}); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"at", "longat"} {
			if err := p.EnqueueAt(ctx, jobs[k], time.Now().Add(-time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := stream.NewProducer(rdb, stream.ProducerConfig{Stream: name}).Enqueue(ctx, jobs["plain"]); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(stream.JobKey(keys, long), long) {
			t.Errorf("JobKey of a 200-byte ID holds the ID: %s", stream.JobKey(keys, long))
		}
		if _, err := stream.PromoteDue(ctx, rdb, name, 10); err != nil {
			t.Fatal(err)
		}
		for k, j := range jobs {
			v, err := rdb.Get(ctx, stream.JobKey(keys, j.ID)).Result()
			if k == "plain" {
				if err == nil {
					t.Errorf("%s: untracked job has a record %q", name, v)
				}
				continue
			}
			r, perr := stream.ParseRecord(v)
			if err != nil || perr != nil || r.State != stream.StateWaiting || r.Entry == "" {
				t.Errorf("%s: record of %s job = %q (%v, %v); want waiting with an entry", name, k, v, err, perr)
			}
		}
	}
}
