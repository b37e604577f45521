// Package etcdtest starts real etcd clusters inside a test process, with
// go.etcd.io/etcd/server/v3/embed, on free loopback ports and throwaway data
// directories. Members can be stopped, started again, wiped, restored from a
// copy of their data, and the leader found, so that tests can kill a leader,
// isolate a member, restart the whole cluster or make it lose its data.
//
// Everything fails loudly (t.Fatal): a test that needs etcd never skips.
//
// It is fencekit's own test equipment, a package of this module so that
// the tests of several modules share it without a test-kit module in any
// user's graph (docs/versioning.md). It is not part of the library: its API
// may change in any release, and no library package imports it.
package etcdtest

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/lease/etcdlease"
)

// Fast timing for tests: heartbeats every 10 ms, elections after 100 ms,
// no fsync. With these the server's minimum lease TTL is 1 s (etcd: 1.5 ×
// the election timeout, rounded up to whole seconds).
const (
	TickMs     = 10
	ElectionMs = 100
)

// startTimeout bounds how long a member (or a whole cluster) may take to be
// ready.
const startTimeout = 30 * time.Second

// Timing is a cluster's raft timing, in milliseconds.
type Timing struct{ TickMs, ElectionMs uint }

// Fast is the tests' timing (TickMs, ElectionMs).
var Fast = Timing{TickMs, ElectionMs}

// Steady is a timing for tests that do not measure elections: heartbeats
// every 50 ms, elections after 500 ms, still a minimum lease TTL of 1 s.
// On a loaded machine (two cores shared by several test runs) the Fast
// timing's 100 ms election timeout is missed by a starved process, and the
// elections that follow stall writes in flight for etcd's request timeout
// (about 5 s): releases then time out and renewals fail, which tests of
// the backend's behaviour must not depend on.
var Steady = Timing{50, 500}

// Default is etcd's own default timing (100 ms heartbeats, 1 s election
// timeout; a minimum lease TTL of 2 s), for benchmarks on a loaded machine:
// with the fast timing a starved process misses heartbeats, and the
// elections that follow stall requests.
var Default = Timing{100, 1000}

// Cluster is a set of embedded etcd members. Its methods must be called from
// the test goroutine.
type Cluster struct {
	t       testing.TB
	token   string
	timing  Timing
	Members []*Member
}

// Member is one embedded etcd server.
type Member struct {
	c         *Cluster
	Name      string
	Dir       string
	peerURL   url.URL
	clientURL url.URL

	mu      sync.Mutex
	e       *embed.Etcd   // nil while stopped
	closing chan struct{} // closed when the last Kill's Close is done; nil if none
	killed  bool          // stopped by Kill and not started since
}

// Start starts a cluster of n members with the Fast timing and waits until
// it has a leader. The cluster is stopped when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartWith(t, n, Fast)
}

// StartWith is Start with the given timing.
func StartWith(t testing.TB, n int, timing Timing) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: %d members", n)
	}
	base := t.TempDir()
	// A port found free can be taken before the member binds it (by a
	// cluster of another test binary running beside this one): the
	// cluster is then started again on other ports, three tries at most.
	for try := 0; ; try++ {
		c := &Cluster{t: t, token: fmt.Sprintf("fencekit-test-%d", time.Now().UnixNano()), timing: timing}
		for i := range n {
			name := fmt.Sprintf("m%d", i)
			c.Members = append(c.Members, &Member{
				c:         c,
				Name:      name,
				Dir:       filepath.Join(base, fmt.Sprintf("try%d", try), name),
				peerURL:   freeURL(t),
				clientURL: freeURL(t),
			})
		}
		err := c.startAll()
		if err != nil && try < 2 && strings.Contains(err.Error(), "address already in use") {
			t.Logf("etcdtest: %v; starting the cluster on other ports", err)
			c.StopAll()
			continue
		}
		t.Cleanup(func() {
			c.StopAll()
			c.awaitPeerConnsClosed()
		})
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		c.WaitLeader()
		return c
	}
}

// handed holds the ports freeURL has handed out in this process.
var handed struct {
	mu    sync.Mutex
	ports map[int]bool
}

// freeURL returns an http URL on a loopback port nothing listens on now,
// chosen below the kernel's ephemeral range (Linux: 32768 and up by
// default): a member that is stopped and started again must find its port
// free, and an ephemeral port can meanwhile become the local end of any
// outgoing connection (a client reconnecting), which makes it refuse the
// bind.
//
// The first tries are in a window of 1,000 ports chosen by the process
// ID, so that test binaries running side by side seldom pick the same
// port: a member's port, free while it is stopped, must not be taken by
// another binary's cluster before it starts again.
//
// A port is handed out once per process: two members of one cluster, or
// a member stopped for a while and a new cluster, never share one.
func freeURL(t testing.TB) url.URL {
	t.Helper()
	window := 15000 + os.Getpid()%17*1000
	handed.mu.Lock()
	defer handed.mu.Unlock()
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	for i := range 400 {
		port := window + mrand.IntN(1000)
		if i >= 100 {
			port = 15000 + mrand.IntN(17000)
		}
		if handed.ports[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		_ = l.Close()
		handed.ports[port] = true
		return url.URL{Scheme: "http", Host: addr}
	}
	t.Fatal("etcdtest: no free loopback port in 15000-31999")
	return url.URL{}
}

func (c *Cluster) initialCluster() string {
	parts := make([]string, len(c.Members))
	for i, m := range c.Members {
		parts[i] = m.Name + "=" + m.peerURL.String()
	}
	return strings.Join(parts, ",")
}

// Endpoints returns the client URLs of the members (all of them, or those
// given by index).
func (c *Cluster) Endpoints(idx ...int) []string {
	if len(idx) == 0 {
		for i := range c.Members {
			idx = append(idx, i)
		}
	}
	eps := make([]string, 0, len(idx))
	for _, i := range idx {
		eps = append(eps, c.Members[i].Endpoint())
	}
	return eps
}

// StartAll starts every stopped member at once (members of a new cluster
// must start together to elect a leader) and waits until each is ready.
func (c *Cluster) StartAll() {
	c.t.Helper()
	if err := c.startAll(); err != nil {
		c.t.Fatalf("etcdtest: %v", err)
	}
	c.WaitLeader()
}

// startAll starts every stopped member at once and returns the first
// error, naming its member.
func (c *Cluster) startAll() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Members))
	for i, m := range c.Members {
		if m.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.start()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("member %s: %w", c.Members[i].Name, err)
		}
	}
	return nil
}

// StopAll stops every running member: the followers first, in parallel,
// then the leader once it has stepped down.
//
// A leader that is stopped hands leadership over first (etcd's graceful
// Stop) and waits up to etcd's request timeout (5 s + 2 election timeouts)
// for its transferee to take over; stopped together with its followers, the
// transferee never does, and every whole-cluster stop cost that timeout
// (6 s with the Steady timing). With its followers gone the leader steps
// down by itself after an election timeout (etcd runs raft with
// CheckQuorum), and a member that does not lead stops at once.
func (c *Cluster) StopAll() {
	var leader *Member
	var wg sync.WaitGroup
	for _, m := range c.Members {
		if e := m.etcd(); e != nil && leader == nil && c.runningCount() > 1 && e.Server.Leader() == e.Server.MemberID() {
			leader = m
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); m.stop() }()
	}
	wg.Wait()
	if leader == nil {
		return
	}
	// Bounded: if it still leads after this, Stop pays the hand-over's
	// timeout as before.
	e := leader.etcd()
	for deadline := time.Now().Add(20 * time.Duration(c.timing.ElectionMs) * time.Millisecond); e != nil && e.Server.Leader() == e.Server.MemberID() && time.Now().Before(deadline); {
		time.Sleep(time.Duration(c.timing.TickMs) * time.Millisecond)
	}
	leader.stop()
}

// peerConnLinger bounds how long a stopped member's peer connections may
// stay open: etcd's peer servers read with a 5 s timeout
// (rafthttp.ConnReadTimeout), set before the stop began, and give up
// closing busy connections after 1 s.
const peerConnLinger = 6 * time.Second

// awaitPeerConnsClosed waits, after the last StopAll, until no connection
// to or from a member's peer port is open (read from /proc/net/tcp and
// tcp6), for at most peerConnLinger. A stopped member's peer server can leave a keep-alive connection
// open until its read timeout: its goroutines, and the other side's, would
// fail goleak at the end of the package. (The old StopAll waited 6 s for a
// leadership hand-over, which happened to cover this.) Without /proc it
// waits for nothing. The ports of a member stopped by Kill are left out:
// Kill can leave its version handler blocked for good (TestMain ignores
// that goroutine), and its connection would hold the wait to its bound.
func (c *Cluster) awaitPeerConnsClosed() {
	ports := map[int]bool{}
	for _, m := range c.Members {
		m.mu.Lock()
		killed := m.killed
		m.mu.Unlock()
		if p, err := strconv.Atoi(m.peerURL.Port()); err == nil && !killed {
			ports[p] = true
		}
	}
	start := time.Now()
	n, err := openConns(ports)
	for ; err == nil && n > 0 && time.Since(start) < peerConnLinger; n, err = openConns(ports) {
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		c.t.Logf("etcdtest: waited %v for the stopped members' peer connections to close (%d still open)", d.Round(time.Millisecond), n)
	}
}

// openConns counts the TCP sockets whose local or remote port is in ports
// and that the process has not closed yet (ESTABLISHED or CLOSE_WAIT).
func openConns(ports map[int]bool) (int, error) {
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || (fs[3] != "01" && fs[3] != "08") {
				continue
			}
			for _, addr := range fs[1:3] {
				i := strings.LastIndexByte(addr, ':')
				if p, err := strconv.ParseInt(addr[i+1:], 16, 32); err == nil && ports[int(p)] {
					n++
					break
				}
			}
		}
	}
	return n, nil
}

// runningCount returns how many members are running.
func (c *Cluster) runningCount() int {
	n := 0
	for _, m := range c.Members {
		if m.Running() {
			n++
		}
	}
	return n
}

// WipeAll stops every member, deletes its data directory, and starts the
// cluster again from nothing, on the same ports: as an operator who lost or
// wiped the disks would. Revisions start again at 1.
func (c *Cluster) WipeAll() {
	c.t.Helper()
	c.StopAll()
	for _, m := range c.Members {
		if err := os.RemoveAll(m.Dir); err != nil {
			c.t.Fatalf("etcdtest: wipe %s: %v", m.Dir, err)
		}
	}
	c.StartAll()
}

// Backup stops every member, copies each data directory, and starts the
// cluster again. Restore puts the copies back: the file-level backup and
// restore of a whole cluster.
func (c *Cluster) Backup() (restore func()) {
	c.t.Helper()
	c.StopAll()
	copies := make([]string, len(c.Members))
	for i, m := range c.Members {
		copies[i] = filepath.Join(c.t.TempDir(), m.Name)
		if err := os.CopyFS(copies[i], os.DirFS(m.Dir)); err != nil {
			c.t.Fatalf("etcdtest: back up %s: %v", m.Dir, err)
		}
	}
	c.StartAll()
	return func() {
		c.t.Helper()
		c.StopAll()
		for i, m := range c.Members {
			if err := os.RemoveAll(m.Dir); err != nil {
				c.t.Fatalf("etcdtest: restore %s: %v", m.Dir, err)
			}
			if err := os.CopyFS(m.Dir, os.DirFS(copies[i])); err != nil {
				c.t.Fatalf("etcdtest: restore %s: %v", m.Dir, err)
			}
		}
		c.StartAll()
	}
}

// WaitLeader waits until every running member agrees on a leader, and
// returns that leader's index.
func (c *Cluster) WaitLeader() int {
	c.t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		lead, agreed := uint64(0), true
		for _, m := range c.Members {
			e := m.etcd()
			if e == nil {
				continue
			}
			l := e.Server.Lead()
			if l == 0 || (lead != 0 && l != lead) {
				agreed = false
				break
			}
			lead = l
		}
		if agreed && lead != 0 {
			for i, m := range c.Members {
				if e := m.etcd(); e != nil && uint64(e.Server.MemberID()) == lead {
					return i
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcdtest: no leader agreed on within %v", startTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Leader returns the index of the current leader (waiting for one).
func (c *Cluster) Leader() int { return c.WaitLeader() }

// Client returns a client of the given endpoints (all members if none),
// closed when the test ends.
func (c *Cluster) Client(endpoints ...string) *clientv3.Client {
	c.t.Helper()
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cli, err := NewClient(endpoints)
	if err != nil {
		c.t.Fatalf("etcdtest: client of %v: %v", endpoints, err)
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewBackend returns a backend over cli under prefix with the test
// servers' minimum TTL (1 s, with either timing: 1.5 × the election
// timeout, rounded up to whole seconds), closed when tb ends. opts come
// after those and may change them.
func NewBackend(tb testing.TB, cli etcdlease.Client, prefix string, opts ...etcdlease.Option) *etcdlease.Backend {
	tb.Helper()
	b, err := etcdlease.New(cli, append([]etcdlease.Option{etcdlease.WithPrefix(prefix), etcdlease.WithMinTTL(time.Second)}, opts...)...)
	if err != nil {
		tb.Fatalf("etcdlease.New: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// NewClient returns a client of endpoints with the settings the tests use:
// a no-op logger, a 2 s dial timeout, keep-alive pings so that a dead
// member is noticed.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
}

// Endpoint returns the member's client URL.
func (m *Member) Endpoint() string { return m.clientURL.String() }

// Running reports whether the member is started.
func (m *Member) Running() bool { return m.etcd() != nil }

func (m *Member) etcd() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.e
}

// Stop stops the member the way etcd shuts down: it drains its clients'
// requests (up to etcd's request timeout, about 5 s, while it still takes
// part in raft), hands leadership over if it leads, and closes.
func (m *Member) Stop() { m.stop() }

// Kill stops the member's raft node at once, without handing leadership
// over (EtcdServer.HardStop): a crash as far as the other members can
// tell. Its listeners close in the background (embed's Close, which waits
// for open client streams); Start, Stop and the test's cleanup wait for
// that.
func (m *Member) Kill() {
	m.mu.Lock()
	e := m.e
	m.e = nil
	var closing chan struct{}
	if e != nil {
		closing = make(chan struct{})
		m.closing = closing
		m.killed = true
	}
	m.mu.Unlock()
	if e == nil {
		return
	}
	e.Server.HardStop()
	go func() {
		defer close(closing)
		e.Close()
	}()
}

// waitClosed waits for the Close of the last Kill.
func (m *Member) waitClosed() {
	m.mu.Lock()
	closing := m.closing
	m.mu.Unlock()
	if closing != nil {
		<-closing
	}
}

// Start starts a stopped member again over its data directory and waits
// until it is ready.
func (m *Member) Start() {
	m.c.t.Helper()
	if err := m.start(); err != nil {
		m.c.t.Fatalf("etcdtest: restart %s: %v", m.Name, err)
	}
}

func (m *Member) stop() {
	m.waitClosed()
	m.mu.Lock()
	e := m.e
	m.e = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

func (m *Member) start() error {
	m.waitClosed()
	if m.Running() {
		return fmt.Errorf("already running")
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.InitialCluster = m.c.initialCluster()
	cfg.InitialClusterToken = m.c.token
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored when the data directory exists
	cfg.TickMs = m.c.timing.TickMs
	cfg.ElectionMs = m.c.timing.ElectionMs
	cfg.UnsafeNoFsync = true
	// The cheapest password hashing bcrypt allows (4; etcd's default is
	// 10): tests that enable authentication check what the backend makes
	// of a refusal, not the hash, and each Authenticate at cost 10 takes
	// seconds on a loaded 2-core machine, past the attempt's bound.
	cfg.BcryptCost = 4
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	var (
		e   *embed.Etcd
		err error
	)
	// A port freed by a member that just stopped, or taken meanwhile by
	// another process, may refuse the bind for a moment: try a few times.
	for attempt := 0; ; attempt++ {
		e, err = embed.StartEtcd(cfg)
		if err == nil || attempt == 50 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("failed while starting: %w", err)
	case <-time.After(startTimeout):
		e.Server.Stop()
		e.Close()
		return fmt.Errorf("not ready within %v", startTimeout)
	}
	m.mu.Lock()
	m.e = e
	m.killed = false
	m.mu.Unlock()
	return nil
}

// MemberID returns the member's raft ID (0 while stopped).
func (m *Member) MemberID() uint64 {
	if e := m.etcd(); e != nil {
		return uint64(e.Server.MemberID())
	}
	return 0
}

// Revision returns the cluster's current revision, read through cli.
func Revision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Get(ctx, "\x00fencekit-etcdtest-probe")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}
