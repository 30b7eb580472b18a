package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds redis-cli --cluster create plus the wait for
// cluster_state:ok on every node.
const clusterTimeout = 30 * time.Second

// Cluster is a local Redis Cluster, started by StartCluster (masters only)
// or StartClusterReplicas (each master with replicas). Its nodes are
// Servers, so a test can Kill9, Stop or Restart one of them, and
// KillMaster kills a master and waits for its replica to take over.
type Cluster struct {
	t        testing.TB
	masters  int
	replicas int
	nodes    []*Server // the first masters were created masters, then the replicas
}

// StartCluster starts masters (at least 3) cluster-enabled redis-servers on
// free ports (--cluster-node-timeout 2000, each with a free cluster bus
// port), joins them with redis-cli --cluster create --cluster-replicas 0,
// which splits the 16384 slots evenly, and returns once every node reports
// cluster_state:ok and knows every other node. It fails the test if that
// takes more than 30 s. Expect 2 to 3 s, mostly spent in redis-cli.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0)
}

// StartClusterReplicas starts a cluster as StartCluster does, with
// replicas replicas per master (redis-cli --cluster create
// --cluster-replicas), and also waits until every replica's link to its
// master is up and the first full sync is done, so that a master killed at
// once has a replica to fail over to. Nodes returns the masters first (in
// slot order), then the replicas. Expect 3 to 5 s.
func StartClusterReplicas(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	if replicas < 1 {
		t.Fatalf("redistest: StartClusterReplicas: replicas (%d) must be at least 1", replicas)
	}
	return startCluster(t, masters, replicas)
}

func startCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: StartCluster: masters (%d) must be at least 3", masters)
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c := &Cluster{t: t, masters: masters, replicas: replicas}
	for range masters * (1 + replicas) {
		c.nodes = append(c.nodes, start(t, Options{}, true))
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()

	// redis-cli takes the first masters addresses as masters and assigns
	// the rest as their replicas.
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %v: %v\n%s", args, err, out)
	}

	want := strconv.Itoa(len(c.nodes))
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
	for _, n := range c.nodes[masters:] {
		for {
			info, err := probe(n.Addr(), nil, probeTimeout, "INFO", "replication")
			if err == nil && infoField(info, "master_link_status") == "up" &&
				infoField(info, "master_sync_in_progress") == "0" {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: replica %s not in sync after %v: %v %s\nlog %s, last lines:\n%s",
					n.Addr(), clusterTimeout, err, info, n.logPath, n.logTail())
			case <-time.After(pollInterval):
			}
		}
	}
	// Every node knows every replica's master (gossip), so KillMaster
	// may ask any node.
	for _, n := range c.nodes {
		for {
			nodes, err := ClusterNodes(n)
			ms, rs := 0, 0
			for _, x := range nodes {
				if x.Is("master") && len(x.Slots) > 0 {
					ms++
				}
				if x.Is("slave") && x.Master != "" {
					rs++
				}
			}
			if err == nil && ms == masters && rs == masters*replicas {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: node %s sees %d masters and %d replicas after %v (%v), want %d and %d",
					n.Addr(), ms, rs, clusterTimeout, err, masters, masters*replicas)
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
// address, closed by t.Cleanup. Each opts function may change the options
// before the client is created. Note that go-redis (v9.23) reloads its
// slot map only on MOVED or READONLY replies and every
// ClusterStateReloadInterval (60 s by default): after a failover, commands
// for the dead master's slots fail with connection errors until then, so
// a test that kills a master sets a short interval.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns the cluster's servers: the masters as created, in the
// order their slot ranges were assigned (the first owns slot 0), then the
// replicas. After a failover the roles may have changed: see Masters.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// ClusterNode is one line of CLUSTER NODES, as seen by one node.
type ClusterNode struct {
	ID     string
	Addr   string   // "127.0.0.1:port"
	Flags  []string // such as "myself", "master", "slave", "fail", "fail?"
	Master string   // the master's ID, for a replica; "" otherwise
	Slots  []string // slot ranges ("0-5460"), for a master
}

// Is reports whether the node has flag.
func (n ClusterNode) Is(flag string) bool {
	for _, f := range n.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

// ClusterNodes returns CLUSTER NODES as node s sees it.
func ClusterNodes(s *Server) ([]ClusterNode, error) {
	out, err := probe(s.Addr(), nil, probeTimeout, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	var nodes []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("redistest: CLUSTER NODES line %q", line)
		}
		n := ClusterNode{ID: f[0], Addr: strings.SplitN(f[1], "@", 2)[0], Flags: strings.Split(f[2], ","), Slots: f[8:]}
		if f[3] != "-" {
			n.Master = f[3]
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// server returns the cluster's Server at addr, or nil.
func (c *Cluster) server(addr string) *Server {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// alive returns the nodes whose process runs.
func (c *Cluster) alive() []*Server {
	var up []*Server
	for _, n := range c.nodes {
		n.mu.Lock()
		exited := n.proc.exited()
		n.mu.Unlock()
		if !exited {
			up = append(up, n)
		}
	}
	return up
}

// Masters returns the servers that are masters owning slots now, as the
// first running node sees it, in slot order.
func (c *Cluster) Masters() []*Server {
	c.t.Helper()
	up := c.alive()
	if len(up) == 0 {
		c.t.Fatal("redistest: Masters: no node is running")
	}
	nodes, err := ClusterNodes(up[0])
	if err != nil {
		c.t.Fatalf("redistest: Masters: %v", err)
	}
	type owned struct {
		s     *Server
		first int
	}
	var ms []owned
	for _, n := range nodes {
		if n.Is("master") && !n.Is("fail") && len(n.Slots) > 0 {
			first, _ := strconv.Atoi(strings.SplitN(n.Slots[0], "-", 2)[0])
			if s := c.server(n.Addr); s != nil {
				ms = append(ms, owned{s, first})
			}
		}
	}
	for i := range ms { // insertion sort by first slot: a handful of nodes
		for j := i; j > 0 && ms[j].first < ms[j-1].first; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
	out := make([]*Server, len(ms))
	for i, m := range ms {
		out[i] = m.s
	}
	return out
}

// KillMaster kills master with SIGKILL and waits until one of its
// replicas has been promoted and every running node reports
// cluster_state:ok with the promoted node owning the dead master's slots;
// it returns the promoted node. With cluster-node-timeout 2000 ms, expect 2
// to 5 s. It fails the test if master is not a master with a replica, or
// after 30 s, so call it from the test's goroutine.
func (c *Cluster) KillMaster(master *Server) *Server {
	c.t.Helper()
	nodes, err := ClusterNodes(master)
	if err != nil {
		c.t.Fatalf("redistest: KillMaster: %v", err)
	}
	var me ClusterNode
	replicas := map[string]bool{}
	for _, n := range nodes {
		if n.Is("myself") {
			me = n
		}
	}
	for _, n := range nodes {
		if n.Master == me.ID && me.ID != "" {
			replicas[n.Addr] = true
		}
	}
	if !me.Is("master") || len(replicas) == 0 {
		c.t.Fatalf("redistest: KillMaster: %s is not a master with a replica (flags %v)", master.Addr(), me.Flags)
	}
	master.Kill9()
	deadline := time.Now().Add(clusterTimeout)
	var last string
	for time.Now().Before(deadline) {
		if promoted := c.promoted(me, replicas, &last); promoted != nil {
			return promoted
		}
		time.Sleep(pollInterval)
	}
	c.t.Fatalf("redistest: KillMaster: no replica of %s took over within %v: %s", master.Addr(), clusterTimeout, last)
	return nil
}

// promoted returns the replica (of replicas) that owns dead's slots, once
// every running node reports cluster_state:ok and agrees; nil before.
func (c *Cluster) promoted(dead ClusterNode, replicas map[string]bool, last *string) *Server {
	var winner string
	for _, s := range c.alive() {
		info, err := probe(s.Addr(), nil, probeTimeout, "CLUSTER", "INFO")
		if err != nil || infoField(info, "cluster_state") != "ok" {
			*last = fmt.Sprintf("%s: cluster_state %q (%v)", s.Addr(), infoField(info, "cluster_state"), err)
			return nil
		}
		nodes, err := ClusterNodes(s)
		if err != nil {
			*last = err.Error()
			return nil
		}
		owner := ""
		for _, n := range nodes {
			if n.Is("master") && !n.Is("fail") && !n.Is("fail?") && strings.Join(n.Slots, " ") == strings.Join(dead.Slots, " ") {
				owner = n.Addr
			}
		}
		if !replicas[owner] || (winner != "" && owner != winner) {
			*last = fmt.Sprintf("%s sees slots %v owned by %q", s.Addr(), dead.Slots, owner)
			return nil
		}
		winner = owner
	}
	return c.server(winner)
}
