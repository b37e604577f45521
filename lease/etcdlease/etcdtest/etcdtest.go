// Package etcdtest starts real etcd clusters for tests, on free loopback
// ports and throwaway data directories. Members can be stopped, killed,
// started again, wiped, restored from a copy of their data, and the leader
// found, so that tests can kill a leader, isolate a member, restart the
// whole cluster or make it lose its data.
//
// Each member is a process of its own: the program in etcdtest/etcdmember
// (go.etcd.io/etcd/server/v3/embed), built with go build into the user's
// cache, without the race detector. Run inside a race-enabled test binary,
// etcd's server was instrumented too and cost more CPU than the tests
// around it; as a process of its own, a killed member is also a crash as
// the operating system makes one. A member dies with the test process.
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
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/internal/testkit/ports"
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

// Cluster is a set of etcd members. Its methods must be called from
// the test goroutine.
type Cluster struct {
	t       testing.TB
	token   string
	timing  Timing
	Members []*Member
}

// Member is one etcd server, a process of its own.
type Member struct {
	c         *Cluster
	Name      string
	Dir       string
	peerURL   url.URL
	clientURL url.URL

	mu sync.Mutex
	p  *proc  // nil while stopped
	id uint64 // the raft ID p reported
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
		t.Cleanup(c.StopAll)
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		c.WaitLeader()
		return c
	}
}

// freeURL returns an http URL on a loopback port that no other server of
// this process or of another test process has (package ports says how).
func freeURL(t testing.TB) url.URL {
	t.Helper()
	return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports.Loopback(t))}
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
		if p, id := m.proc(); p != nil && leader == nil && c.runningCount() > 1 && leads(p, id) {
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
	p, id := leader.proc()
	for deadline := time.Now().Add(20 * time.Duration(c.timing.ElectionMs) * time.Millisecond); p != nil && leads(p, id) && time.Now().Before(deadline); {
		time.Sleep(time.Duration(c.timing.TickMs) * time.Millisecond)
	}
	leader.stop()
}

// leads reports whether the member of p (raft ID id) leads, as it knows;
// false if it cannot say.
func leads(p *proc, id uint64) bool {
	lead, _, err := p.status()
	return err == nil && lead == id
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
	var lastErr error
	for {
		lead, agreed := uint64(0), true
		for _, m := range c.Members {
			p, _ := m.proc()
			if p == nil {
				continue
			}
			l, _, err := p.status()
			if err != nil {
				lastErr = fmt.Errorf("member %s: %w", m.Name, err)
			}
			if l == 0 || (lead != 0 && l != lead) {
				agreed = false
				break
			}
			lead = l
		}
		if agreed && lead != 0 {
			for i, m := range c.Members {
				if p, id := m.proc(); p != nil && id == lead {
					return i
				}
			}
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				c.t.Fatalf("etcdtest: no leader agreed on within %v (last error: %v)", startTimeout, lastErr)
			}
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

// Running reports whether the member is started (and its process has not
// ended).
func (m *Member) Running() bool {
	p, _ := m.proc()
	return p != nil
}

// proc returns the member's running process and raft ID (nil, 0 while
// stopped, or once the process has ended).
func (m *Member) proc() (*proc, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p == nil || m.p.exited() {
		return nil, 0
	}
	return m.p, m.id
}

// Stop stops the member the way etcd shuts down: it drains its clients'
// requests (up to etcd's request timeout, about 5 s, while it still takes
// part in raft), hands leadership over if it leads, and closes.
func (m *Member) Stop() { m.stop() }

// Kill kills the member's process (SIGKILL on Unix): a crash, without a
// leadership hand-over, with nothing flushed or closed on the way out. It
// returns once the process has ended.
func (m *Member) Kill() {
	if p := m.take(); p != nil {
		p.kill()
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

// take marks the member stopped and returns the process it had (nil if
// none).
func (m *Member) take() *proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.p
	m.p, m.id = nil, 0
	return p
}

func (m *Member) stop() {
	if p := m.take(); p != nil {
		p.stop()
	}
}

func (m *Member) start() error {
	if m.Running() {
		return fmt.Errorf("already running")
	}
	// A process that ended on its own (nothing stopped it) is reaped.
	m.take()
	p, id, err := startProc([]string{
		"-name", m.Name,
		"-dir", m.Dir,
		"-peer-url", m.peerURL.String(),
		"-client-url", m.clientURL.String(),
		"-initial-cluster", m.c.initialCluster(),
		"-token", m.c.token,
		"-tick-ms", strconv.FormatUint(uint64(m.c.timing.TickMs), 10),
		"-election-ms", strconv.FormatUint(uint64(m.c.timing.ElectionMs), 10),
		"-ready-within", startTimeout.String(),
	}, startTimeout)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.p, m.id = p, id
	m.mu.Unlock()
	return nil
}

// MemberID returns the member's raft ID (0 while stopped).
func (m *Member) MemberID() uint64 {
	_, id := m.proc()
	return id
}

// Revision returns the cluster's current revision, read through cli.
func Revision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Get(ctx, "\x00fencekit-etcdtest-probe")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}
