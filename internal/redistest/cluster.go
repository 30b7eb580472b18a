package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds redis-cli --cluster create plus the wait for
// cluster_state:ok on every node.
const clusterTimeout = 30 * time.Second

// Cluster is a local Redis Cluster of masters without replicas, started by
// StartCluster. Its nodes are Servers, so a test can Kill9, Stop or
// Restart one of them.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts masters (at least 3) cluster-enabled redis-servers on
// free ports (--cluster-node-timeout 2000, each with a free cluster bus
// port), joins them with redis-cli --cluster create --cluster-replicas 0,
// which splits the 16384 slots evenly, and returns once every node reports
// cluster_state:ok and knows every other node. It fails the test if that
// takes more than 30 s. Expect 2 to 3 s, mostly spent in redis-cli.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: StartCluster: masters (%d) must be at least 3", masters)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c := &Cluster{}
	for range masters {
		c.nodes = append(c.nodes, start(t, Options{}, true))
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()

	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %v: %v\n%s", args, err, out)
	}

	want := strconv.Itoa(masters)
	for _, n := range c.nodes {
		for {
			info, err := probe(n.Addr(), nil, probeTimeout, "CLUSTER", "INFO")
			if err == nil && infoField(info, "cluster_state") == "ok" &&
				infoField(info, "cluster_known_nodes") == want {
				break
			}
			if err == nil {
				err = fmt.Errorf("cluster_state:%s cluster_known_nodes:%s",
					infoField(info, "cluster_state"), infoField(info, "cluster_known_nodes"))
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: cluster node %s not ready after %v: %v\nlog %s, last lines:\n%s",
					n.Addr(), clusterTimeout, err, n.logPath, n.logTail())
			case <-time.After(pollInterval):
			}
		}
	}
	return c
}

// Addrs returns the nodes' addresses ("127.0.0.1:port"), in Nodes order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with every node's
// address, closed by t.Cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns the cluster's servers, one per master, in the order their
// slot ranges were assigned (the first owns slot 0).
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}
