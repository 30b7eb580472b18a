package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pelicanqueue/pelican/dashboard"
	"github.com/pelicanqueue/pelican/internal/queuestats"
	"github.com/pelicanqueue/pelican/stream"
)

// clusterDashboard reads a queue in the slot of name through the
// dashboard's overview (queuestats.Collect: a pipeline split by the
// cluster client, and reasons.lua on the queue's master) and its
// dead-letter page.
func clusterDashboard(t *testing.T, cc *redis.ClusterClient, name string) {
	t.Helper()
	ctx := t.Context()
	source, err := stream.DerivedKey(name, "dashtest")
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := stream.KeysFor(source)
	t.Cleanup(func() {
		for _, k := range []string{source, keys.Dead} {
			cc.Del(context.Background(), k)
		}
	})
	if err := cc.XAdd(ctx, &redis.XAddArgs{Stream: source, Values: []any{"type", "a", "payload", "{}"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"panic", "panic", "exhausted"} {
		if err := cc.XAdd(ctx, &redis.XAddArgs{Stream: keys.Dead, Values: []any{"type", "a", "payload", "{}", "dead_reason", r}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	qs, _, err := queuestats.Collect(ctx, cc, []string{source}, queuestats.Options{})
	if err != nil || qs[0].Err != nil || qs[0].ReasonsErr != nil {
		t.Fatalf("Collect on the cluster: %v, %v, %v", err, qs[0].Err, qs[0].ReasonsErr)
	}
	if q := qs[0]; q.Length != 1 || q.DeadLetters != 3 || q.DeadByReason["panic"] != 2 || q.DeadByReason["exhausted"] != 1 {
		t.Errorf("Collect on the cluster: %+v", q)
	}
	d, err := dashboard.New(cc, dashboard.Config{Streams: []string{source}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, path := range []string{"/", "/queues/" + source + "/dead"} {
		w := httptest.NewRecorder()
		d.ServeHTTP(w, httptest.NewRequest("GET", strings.NewReplacer("{", "%7B", "}", "%7D").Replace(path), nil).WithContext(ctx))
		if w.Code != http.StatusOK {
			t.Errorf("GET %s on the cluster = %d:\n%s", path, w.Code, w.Body.String())
		}
	}
}
