package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pelicanqueue/pelican/control"
	"github.com/pelicanqueue/pelican/stream"
)

// The optional producer lines of docs/acl.md: a producer of tracked jobs,
// or with EnqueueOnce, is refused without them (a permission error, nothing
// added) and works with them, with nothing denied in Redis's ACL LOG.
func TestACL_producerOptionalLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newACLServer(t)
	a.setUser(t, "orders-producer", false)
	keys, _ := stream.KeysFor(aclStream)
	cases := []struct {
		name string
		cfg  stream.ProducerConfig
	}{
		{"tracked", stream.ProducerConfig{Stream: aclStream, Track: true}},
		{"once", stream.ProducerConfig{Stream: aclStream, EnqueueOnce: time.Hour}},
	}
	job := func(name string, i int) *stream.Job {
		return &stream.Job{Type: "acl", Payload: []byte("{}"), ID: fmt.Sprintf("%s-%d", name, i), IdempotencyKey: fmt.Sprintf("%s-k%d", name, i)}
	}
	for _, tc := range cases {
		p := stream.NewProducer(a.client(t, "orders-producer"), tc.cfg)
		if _, err := p.Enqueue(ctx, job(tc.name, 0)); err == nil || !hasPermissionText(err.Error()) {
			t.Fatalf("%s: Enqueue without the optional line: %v; want a permission error", tc.name, err)
		}
		if _, err := p.EnqueueBatch(ctx, []*stream.Job{job(tc.name, 1), job(tc.name, 2)}); err == nil || !hasPermissionText(err.Error()) {
			t.Fatalf("%s: EnqueueBatch without the optional line: %v; want a permission error", tc.name, err)
		}
	}
	if n := a.admin.XLen(ctx, aclStream).Val(); n != 0 {
		t.Fatalf("refused enqueues added %d entries, want 0", n)
	}
	a.denials(t) // the refusals above are denials: start afresh

	a.setUser(t, "orders-producer", true)
	for _, tc := range cases {
		p := stream.NewProducer(a.client(t, "orders-producer"), tc.cfg)
		if _, err := p.Enqueue(ctx, job(tc.name, 0)); err != nil {
			t.Fatalf("%s: Enqueue with the optional lines: %v", tc.name, err)
		}
		if _, err := p.EnqueueBatch(ctx, []*stream.Job{job(tc.name, 1), job(tc.name, 2)}); err != nil {
			t.Fatalf("%s: EnqueueBatch with the optional lines: %v", tc.name, err)
		}
		if err := p.EnqueueIn(ctx, job(tc.name, 3), time.Hour); err != nil {
			t.Fatalf("%s: EnqueueIn with the optional lines: %v", tc.name, err)
		}
	}
	if n := a.admin.XLen(ctx, aclStream).Val(); n != 6 {
		t.Fatalf("stream length %d after 6 enqueues, want 6", n)
	}
	if n := a.admin.ZCard(ctx, keys.Delayed).Val(); n != 2 {
		t.Fatalf("delayed set holds %d jobs, want 2", n)
	}
	for i := range 4 {
		info, err := control.Lookup(ctx, a.admin, aclStream, fmt.Sprintf("tracked-%d", i))
		if err != nil || (info.State != stream.StateWaiting && info.State != stream.StateScheduled) {
			t.Fatalf("Lookup(tracked-%d): %+v, %v; want waiting or scheduled", i, info, err)
		}
	}
	if got := a.denials(t); len(got) != 0 {
		t.Fatalf("ACL LOG with the optional producer lines: %s, want nothing denied", strings.Join(got, "; "))
	}
}
