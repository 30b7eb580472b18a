package partition

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pelicanqueue/pelican/internal/redistest"
	"github.com/pelicanqueue/pelican/stream"
)

const snippet = "../../docs/snippets/partition.py"

// python is the interpreter the snippet tests use (scripts/test-deps.sh
// installs redis-py for it).
func python(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import redis").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import redis-py (%v: %s): run scripts/test-deps.sh", py, err, out)
	}
	return py
}

// TestPartition_pythonSnippet checks docs/snippets/partition.py against the
// Go code: the same partition streams and routing for several queues,
// counts and keys; run as written, it enqueues into the Go producer's
// partition; and docs/wire-format.md holds it verbatim.
func TestPartition_pythonSnippet(t *testing.T) {
	t.Parallel()
	py := python(t)
	src, err := os.ReadFile(snippet)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), string(src)) {
		t.Error("docs/wire-format.md does not contain docs/snippets/partition.py verbatim")
	}

	type layout struct {
		Queue string
		N     int
	}
	layouts := []layout{{"orders", 1}, {"orders", 12}, {"a", 3}, {"shop:orders x", 7}, {"café", 100}}
	keys := []string{"", "customer-42", "invoice-1042", "a", "café", "🦤", strings.Repeat("k", 1000)}
	in, _ := json.Marshal(map[string]any{"layouts": layouts, "keys": keys})
	prog := `
import json, sys
sys.path.insert(0, sys.argv[1])
from partition import partitions, partition_of
req = json.loads(sys.stdin.read())
print(json.dumps({
    "partitions": [partitions(l["Queue"], l["N"]) for l in req["layouts"]],
    "routes": [[partition_of(k, n) for n in (1, 2, 3, 12, 1024)] for k in req["keys"]],
}))`
	cmd := exec.Command(py, "-c", prog, "../../docs/snippets")
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	var got struct {
		Partitions [][]string
		Routes     [][]int
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("python output %v: %s", err, out)
	}
	for i, l := range layouts {
		want, err := stream.Partitions(l.Queue, l.N)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got.Partitions[i], " ") != strings.Join(want, " ") {
			t.Errorf("partitions(%q, %d): python %v, Go %v", l.Queue, l.N, got.Partitions[i], want)
		}
	}
	for i, k := range keys {
		for j, n := range []int{1, 2, 3, 12, 1024} {
			if want := stream.PartitionOf(k, n); got.Routes[i][j] != want {
				t.Errorf("partition_of(%.20q, %d): python %d, Go %d", k, n, got.Routes[i][j], want)
			}
		}
	}

	// As written: it enqueues customer-42's job into its partition.
	rdb := redistest.Shared(t)
	queue := strings.ReplaceAll(redistest.Name(t), ":", "-")
	parts, _ := stream.Partitions(queue, 12)
	t.Cleanup(func() { rdb.Del(t.Context(), parts...) })
	host, port, _ := strings.Cut(redistest.Addr(), ":")
	run := exec.Command(py, "partition.py")
	run.Dir = "../../docs/snippets"
	run.Env = append(os.Environ(), "REDIS_HOST="+host, "REDIS_PORT="+port, "PELICAN_QUEUE="+queue, "PELICAN_PARTITIONS=12")
	out, err = run.CombinedOutput()
	if err != nil {
		t.Fatalf("partition.py: %v\n%s", err, out)
	}
	f := strings.Fields(string(out))
	want := parts[stream.PartitionOf("customer-42", 12)]
	if len(f) != 2 || f[0] != want {
		t.Fatalf("partition.py printed %q, want the stream %s and an entry ID", out, want)
	}
	entries, err := rdb.XRange(t.Context(), want, f[1], f[1]).Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("entry %s not in %s: %v %v", f[1], want, entries, err)
	}
	job, err := stream.Decode(entries[0].ID, entries[0].Values)
	if err != nil || job.Type != "order.confirm" || job.IdempotencyKey != "customer-42" {
		t.Fatalf("the snippet's job decodes to %+v, %v", job, err)
	}
}
