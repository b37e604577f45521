package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterOptions configures StartCluster. Zero fields take their defaults.
type ClusterOptions struct {
	// Masters is the number of masters; each serves an equal share of the
	// 16384 hash slots. Default 3.
	Masters int
	// NodeTimeout is cluster-node-timeout: how long a node may not answer
	// before the others count it as failing, which bounds how soon a
	// replica replaces a dead master. Whole milliseconds; default 1 s.
	NodeTimeout time.Duration
	// Extra are more redis-server arguments for every node.
	Extra []string
}

// Cluster is a Redis Cluster owned by one test: Masters masters with one
// replica each, every node a redis-server without persistence on free
// loopback ports (client port and cluster bus port), with its own
// directory. It is built from Go (CLUSTER ADDSLOTSRANGE, MEET, REPLICATE),
// not with redis-cli, and stopped when the test ends.
type Cluster struct {
	opts    ClusterOptions
	nodes   []*Server
	admin   map[*Server]*redis.Client
	ids     map[*Server]string // node IDs; they survive a relaunch (nodes.conf)
	timeout time.Duration      // how long AwaitHealthy waits
}

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// StartCluster starts a cluster and returns once it is healthy in the sense
// of AwaitHealthy: every node agrees on the roles, every master lists its
// replica and the replica is in sync, so a failover can start at once. It
// logs how long that took.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	start := time.Now()
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = time.Second
	}
	if opts.Masters < 1 || opts.NodeTimeout < time.Millisecond || opts.NodeTimeout%time.Millisecond != 0 {
		t.Fatalf("redistest: StartCluster: bad options %+v", opts)
	}
	c := &Cluster{
		opts:    opts,
		admin:   make(map[*Server]*redis.Client),
		ids:     make(map[*Server]string),
		timeout: 30*time.Second + 10*opts.NodeTimeout,
	}
	args := append([]string{
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
		// Replicas sync over the socket at once: a replica that joins is
		// in sync within milliseconds, not after the default 5 s delay.
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
	}, opts.Extra...)
	for range 2 * opts.Masters {
		s := launch(t, &Server{t: t, dir: t.TempDir(), cluster: true, extra: args})
		c.nodes = append(c.nodes, s)
		a := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { _ = a.Close() })
		c.admin[s] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("redistest: StartCluster: %s: %v", what, err)
		}
	}
	for _, s := range c.nodes {
		id, err := c.admin[s].Do(ctx, "CLUSTER", "MYID").Text()
		must("CLUSTER MYID on "+s.Addr, err)
		c.ids[s] = id
	}
	// Slots first, each node with its own config epoch (as redis-cli does),
	// so that no epoch collision has to be resolved once they meet.
	for i, s := range c.nodes[:opts.Masters] {
		lo, hi := i*ClusterSlots/opts.Masters, (i+1)*ClusterSlots/opts.Masters-1
		must("CLUSTER ADDSLOTSRANGE on "+s.Addr, c.admin[s].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err())
	}
	for i, s := range c.nodes {
		must("CLUSTER SET-CONFIG-EPOCH on "+s.Addr, c.admin[s].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err())
	}
	first := c.nodes[0]
	for _, s := range c.nodes[1:] {
		must("CLUSTER MEET from "+s.Addr, c.admin[s].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", first.port, first.busPort).Err())
	}
	c.await(t, ctx, "every node knows every other", func(ctx context.Context) error {
		for _, s := range c.nodes {
			view, err := c.view(ctx, s)
			if err != nil {
				return err
			}
			if len(view) != len(c.nodes) {
				return fmt.Errorf("%s knows %d nodes of %d", s.Addr, len(view), len(c.nodes))
			}
			for _, n := range view {
				if n.has("handshake") || n.has("noaddr") {
					return fmt.Errorf("%s sees %s as %v", s.Addr, n.addr, n.flags)
				}
			}
		}
		return nil
	})
	for i, s := range c.nodes[opts.Masters:] {
		master := c.nodes[i]
		must("CLUSTER REPLICATE on "+s.Addr, c.admin[s].Do(ctx, "CLUSTER", "REPLICATE", c.ids[master]).Err())
	}
	c.AwaitHealthy(t)
	t.Logf("redistest: %d masters + %d replicas healthy after %v", opts.Masters, opts.Masters, time.Since(start).Round(time.Millisecond))
	return c
}

// Nodes returns every node, running or not, in the order they were started
// (the first Masters were the masters at the start).
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// Addrs returns the addresses of every node, for ClusterOptions.Addrs.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Client returns a new cluster client of c (ContextTimeoutEnabled set),
// closed when t ends. opts adjust the options before the client is
// made.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true}
	for _, fn := range opts {
		fn(o)
	}
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Admin returns a client of the node s alone (no redirections, no
// retries), for commands such as CLUSTER FAILOVER or WAIT. It is closed
// when the test ends.
func (c *Cluster) Admin(s *Server) *redis.Client { return c.admin[s] }

// ID returns the cluster node ID of s.
func (c *Cluster) ID(s *Server) string { return c.ids[s] }

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, masterID string
	flags              []string
	connected          bool
	slots              int // number of slots served
}

func (n clusterNode) has(flag string) bool { return slices.Contains(n.flags, flag) }
func (n clusterNode) master() bool         { return n.has("master") }

// view returns the cluster as node s sees it.
func (c *Cluster) view(ctx context.Context, s *Server) ([]clusterNode, error) {
	out, err := c.admin[s].ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", s.Addr, err)
	}
	var nodes []clusterNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNode{id: f[0], addr: f[1], masterID: f[3], connected: f[7] == "connected"}
		if i := strings.IndexByte(n.addr, '@'); i >= 0 {
			n.addr = n.addr[:i]
		}
		for flag := range strings.SplitSeq(f[2], ",") {
			n.flags = append(n.flags, strings.TrimPrefix(flag, "myself"))
		}
		n.flags = slices.DeleteFunc(n.flags, func(s string) bool { return s == "" })
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, ok := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if ok {
				b, _ = strconv.Atoi(hi)
			}
			n.slots += b - a + 1
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func (c *Cluster) byID(id string) *Server {
	for s, sid := range c.ids {
		if sid == id {
			return s
		}
	}
	return nil
}

// running returns the running nodes.
func (c *Cluster) running() []*Server {
	var r []*Server
	for _, s := range c.nodes {
		if s.Running() {
			r = append(r, s)
		}
	}
	return r
}

// Healthy returns nil when the whole cluster is ready for a failover test,
// else what is not yet so: every node is running and in state ok with all
// slots served; every node has the same view of which node is a master and
// of which master each replica follows, with no node flagged as failing or
// disconnected; every master serves slots and lists exactly one replica,
// which reports its link up and no sync in progress, and which the master
// reports online. (cluster_state:ok alone is not enough: CLUSTER FAILOVER
// is refused until the master lists its replica.)
func (c *Cluster) Healthy(ctx context.Context) error {
	var ref map[string]clusterNode
	for _, s := range c.nodes {
		if !s.Running() {
			return fmt.Errorf("%s is not running", s.Addr)
		}
		info, err := c.admin[s].ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", s.Addr, err)
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", "cluster_known_nodes:" + strconv.Itoa(len(c.nodes))} {
			if !hasLine(info, want) {
				return fmt.Errorf("%s: no %q in CLUSTER INFO", s.Addr, want)
			}
		}
		view, err := c.view(ctx, s)
		if err != nil {
			return err
		}
		byID := make(map[string]clusterNode, len(view))
		for _, n := range view {
			if n.has("fail") || n.has("fail?") || n.has("handshake") || n.has("noaddr") || !n.connected {
				return fmt.Errorf("%s sees %s as %v (connected %v)", s.Addr, n.addr, n.flags, n.connected)
			}
			byID[n.id] = n
		}
		if ref == nil {
			ref = byID
			continue
		}
		for id, n := range byID {
			r, ok := ref[id]
			if !ok || r.master() != n.master() || r.masterID != n.masterID || r.slots != n.slots {
				return fmt.Errorf("%s and %s disagree about node %s", c.nodes[0].Addr, s.Addr, n.addr)
			}
		}
	}
	replicas := make(map[string]int)
	for _, n := range ref {
		if !n.master() {
			replicas[n.masterID]++
		}
	}
	for id, n := range ref {
		s := c.byID(id)
		if s == nil {
			return fmt.Errorf("node %s (%s) is not one of ours", id, n.addr)
		}
		repl, err := c.admin[s].Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("INFO replication on %s: %w", s.Addr, err)
		}
		if n.master() {
			if n.slots == 0 || replicas[id] != 1 {
				return fmt.Errorf("master %s serves %d slots with %d replicas", s.Addr, n.slots, replicas[id])
			}
			if !hasLine(repl, "connected_slaves:1") || !strings.Contains(repl, "state=online") {
				return fmt.Errorf("master %s does not list its replica online", s.Addr)
			}
			continue
		}
		for _, want := range []string{"role:slave", "master_link_status:up", "master_sync_in_progress:0"} {
			if !hasLine(repl, want) {
				return fmt.Errorf("replica %s: no %q in INFO replication", s.Addr, want)
			}
		}
	}
	return nil
}

// AwaitHealthy waits until Healthy reports nil, and fails the test if that
// takes too long (30 s plus ten node timeouts).
func (c *Cluster) AwaitHealthy(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	c.await(t, ctx, "the cluster to become healthy", c.Healthy)
}

// await polls check until it returns nil, failing the test with its last
// error when ctx ends.
func (c *Cluster) await(t testing.TB, ctx context.Context, what string, check func(context.Context) error) {
	t.Helper()
	if err := poll(ctx, check); err != nil {
		t.Fatalf("redistest: waiting for %s: %v", what, err)
	}
}

// poll calls check every 20 ms (each call bounded by 2 s) until it returns
// nil or ctx ends; it then returns the last error of check, joined with
// ctx's.
func poll(ctx context.Context, check func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// hasLine reports whether the INFO-style text s has the line line.
func hasLine(s, line string) bool {
	for l := range strings.Lines(s) {
		if strings.TrimRight(l, "\r\n") == line {
			return true
		}
	}
	return false
}

// infoField returns the value of field in the INFO-style text s.
func infoField(s, field string) string {
	for l := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r\n"), field+":"); ok {
			return v
		}
	}
	return ""
}

// CurrentEpoch returns the greatest cluster_current_epoch the running nodes
// report. Every failover, manual or not, raises it: a test that compares it
// before and after can tell that the cluster failed over by itself (a node
// that did not answer within the node timeout, on an overloaded machine).
func (c *Cluster) CurrentEpoch(t testing.TB) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var epoch int64
	for _, s := range c.running() {
		info, err := c.admin[s].ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatalf("redistest: CLUSTER INFO on %s: %v", s.Addr, err)
		}
		n, _ := strconv.ParseInt(infoField(info, "cluster_current_epoch"), 10, 64)
		epoch = max(epoch, n)
	}
	return epoch
}

// Slot returns the hash slot of key.
func (c *Cluster) Slot(t testing.TB, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range c.running() {
		n, err := c.admin[s].ClusterKeySlot(ctx, key).Result()
		if err == nil {
			return int(n)
		}
	}
	t.Fatalf("redistest: no running node answers CLUSTER KEYSLOT")
	return 0
}

// MasterFor returns the node that serves key's slot, as the running nodes
// see it now.
func (c *Cluster) MasterFor(t testing.TB, key string) *Server {
	t.Helper()
	return c.slotOwner(t, c.Slot(t, key))
}

func (c *Cluster) slotOwner(t testing.TB, slot int) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lastErr error
	for _, s := range c.running() {
		shards, err := c.admin[s].ClusterShards(ctx).Result()
		if err != nil {
			lastErr = err
			continue
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if int(r.Start) <= slot && slot <= int(r.End) {
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							if owner := c.byID(n.ID); owner != nil {
								return owner
							}
						}
					}
				}
			}
		}
	}
	t.Fatalf("redistest: no master found for slot %d (%v)", slot, lastErr)
	return nil
}

// SlotOwners returns, for every hash slot, the node that serves it now (one
// CLUSTER SHARDS), indexed by slot.
func (c *Cluster) SlotOwners(t testing.TB) []*Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	owners := make([]*Server, ClusterSlots)
	for _, s := range c.running() {
		shards, err := c.admin[s].ClusterShards(ctx).Result()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			var master *Server
			for _, n := range sh.Nodes {
				if n.Role == "master" {
					master = c.byID(n.ID)
				}
			}
			for _, r := range sh.Slots {
				for slot := r.Start; slot <= r.End; slot++ {
					owners[slot] = master
				}
			}
		}
		for slot, o := range owners {
			if o == nil {
				t.Fatalf("redistest: slot %d has no master", slot)
			}
		}
		return owners
	}
	t.Fatalf("redistest: no running node answers CLUSTER SHARDS")
	return nil
}

// ReplicaOf returns the replica of master, as master sees it now.
func (c *Cluster) ReplicaOf(t testing.TB, master *Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	view, err := c.view(ctx, master)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, n := range view {
		if !n.master() && n.masterID == c.ids[master] {
			return c.byID(n.id)
		}
	}
	t.Fatalf("redistest: master %s has no replica", master.Addr)
	return nil
}

// Masters returns the nodes that serve slots now.
func (c *Cluster) Masters(t testing.TB) []*Server {
	t.Helper()
	var ms []*Server
	for _, m := range c.SlotOwners(t) {
		if !slices.Contains(ms, m) {
			ms = append(ms, m)
		}
	}
	return ms
}

// Failover runs a manual failover of master (CLUSTER FAILOVER on its
// replica: the master stops its clients, the replica catches up and takes
// over), waits until the cluster is healthy again with the roles swapped,
// and returns the new master and the time from the command to the moment
// every node saw the replica serve the slots.
func (c *Cluster) Failover(t testing.TB, master *Server) (*Server, time.Duration) {
	t.Helper()
	replica := c.ReplicaOf(t, master)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	if err := c.admin[replica].Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("redistest: CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	c.await(t, ctx, "the manual failover", func(ctx context.Context) error { return c.serves(ctx, replica, master) })
	took := time.Since(start)
	c.AwaitHealthy(t)
	return replica, took
}

// AwaitPromoted waits until replica has replaced its master dead, which
// must have been killed: every running node sees dead as failed and
// serving no slots, and replica as a master serving slots, and the cluster
// is in state ok. It returns how long it waited.
func (c *Cluster) AwaitPromoted(t testing.TB, dead, replica *Server) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	c.await(t, ctx, replica.Addr+" to replace "+dead.Addr, func(ctx context.Context) error {
		if err := c.serves(ctx, replica, dead); err != nil {
			return err
		}
		for _, s := range c.running() {
			view, err := c.view(ctx, s)
			if err != nil {
				return err
			}
			for _, n := range view {
				if n.id == c.ids[dead] && !n.has("fail") {
					return fmt.Errorf("%s sees %s as %v", s.Addr, n.addr, n.flags)
				}
			}
			info, err := c.admin[s].ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !hasLine(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster state not ok", s.Addr)
			}
		}
		return nil
	})
	return time.Since(start)
}

// serves reports nil once every running node sees s as a master serving
// slots and old as a replica or failed.
func (c *Cluster) serves(ctx context.Context, s, old *Server) error {
	for _, r := range c.running() {
		view, err := c.view(ctx, r)
		if err != nil {
			return err
		}
		for _, n := range view {
			switch n.id {
			case c.ids[s]:
				if !n.master() || n.slots == 0 {
					return fmt.Errorf("%s sees %s as %v with %d slots", r.Addr, s.Addr, n.flags, n.slots)
				}
			case c.ids[old]:
				if n.slots > 0 {
					return fmt.Errorf("%s sees %s still serve %d slots", r.Addr, old.Addr, n.slots)
				}
			}
		}
	}
	return nil
}
