package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configures StartSentinel. Zero fields take their
// defaults.
type SentinelOptions struct {
	// MasterName is the name the Sentinels monitor the primary under.
	// Default "fencekit".
	MasterName string
	// Sentinels is the number of Sentinel processes. Default 3.
	Sentinels int
	// Quorum is how many Sentinels must agree that the primary is down.
	// Default a majority of Sentinels.
	Quorum int
	// DownAfter is down-after-milliseconds: how long the primary may not
	// answer before a Sentinel counts it as down. Default 1 s.
	DownAfter time.Duration
	// FailoverTimeout is the Sentinels' failover-timeout. Sentinel does
	// not fail the same primary over again within twice this time.
	// Default 2 s.
	FailoverTimeout time.Duration
	// InfoPeriod, if set, changes how often each Sentinel reads INFO from
	// the data nodes and announces itself (SENTINEL DEBUG info-period and
	// publish-period; Redis 7.0+). Sentinel's defaults, 10 s and 2 s, make
	// it learn of a rejoined replica up to 10 s late. Default 250 ms.
	InfoPeriod time.Duration
}

// Sentinel is a Redis Sentinel deployment owned by one test: a primary,
// one replica and Sentinels that monitor them, every process a
// redis-server without persistence on a free loopback port with its own
// directory, stopped when the test ends.
type Sentinel struct {
	opts      SentinelOptions
	data      []*Server // the primary and its replica, in start order
	sentinels []*Server
	admin     map[*Server]*redis.Client
	timeout   time.Duration
}

// StartSentinel starts a Sentinel deployment and returns once it is healthy
// in the sense of AwaitHealthy. It logs how long that took.
func StartSentinel(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	start := time.Now()
	if opts.MasterName == "" {
		opts.MasterName = "fencekit"
	}
	if opts.Sentinels == 0 {
		opts.Sentinels = 3
	}
	if opts.Quorum == 0 {
		opts.Quorum = opts.Sentinels/2 + 1
	}
	if opts.DownAfter == 0 {
		opts.DownAfter = time.Second
	}
	if opts.FailoverTimeout == 0 {
		opts.FailoverTimeout = 2 * time.Second
	}
	if opts.InfoPeriod == 0 {
		opts.InfoPeriod = 250 * time.Millisecond
	}
	s := &Sentinel{opts: opts, admin: make(map[*Server]*redis.Client), timeout: 30*time.Second + 10*opts.DownAfter}
	adminOf := func(srv *Server) {
		a := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { _ = a.Close() })
		s.admin[srv] = a
	}
	repl := []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
	primary := launch(t, &Server{t: t, dir: t.TempDir(), extra: repl})
	adminOf(primary)
	replica := launch(t, &Server{t: t, dir: t.TempDir(), extra: append(slices.Clone(repl), "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))})
	adminOf(replica)
	s.data = []*Server{primary, replica}

	for range opts.Sentinels {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
			"sentinel down-after-milliseconds %[1]s %[4]d\n"+
			"sentinel failover-timeout %[1]s %[5]d\n"+
			"sentinel parallel-syncs %[1]s 1\n",
			opts.MasterName, primary.port, opts.Quorum, opts.DownAfter.Milliseconds(), opts.FailoverTimeout.Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatalf("redistest: StartSentinel: %v", err)
		}
		sen := launch(t, &Server{t: t, dir: dir, conf: conf, extra: []string{"--sentinel"}})
		adminOf(sen)
		ms := opts.InfoPeriod.Milliseconds()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.admin[sen].Do(ctx, "SENTINEL", "DEBUG", "info-period", ms, "publish-period", ms).Err()
		cancel()
		if err != nil {
			t.Fatalf("redistest: StartSentinel: SENTINEL DEBUG on %s: %v", sen.Addr, err)
		}
		s.sentinels = append(s.sentinels, sen)
	}
	s.AwaitHealthy(t)
	t.Logf("redistest: primary, replica and %d Sentinels healthy after %v", opts.Sentinels, time.Since(start).Round(time.Millisecond))
	return s
}

// MasterName returns the name the Sentinels monitor the primary under.
func (s *Sentinel) MasterName() string { return s.opts.MasterName }

// SentinelAddrs returns the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sen := range s.sentinels {
		addrs[i] = sen.Addr
	}
	return addrs
}

// DataNodes returns the primary and the replica, in start order (not by
// current role).
func (s *Sentinel) DataNodes() []*Server { return slices.Clone(s.data) }

// Sentinels returns the Sentinel processes.
func (s *Sentinel) Sentinels() []*Server { return slices.Clone(s.sentinels) }

// Client returns a new failover client (go-redis NewFailoverClient, with
// ContextTimeoutEnabled set) that finds the primary through the Sentinels,
// closed when t ends. opts adjust the options first.
func (s *Sentinel) Client(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	o := &redis.FailoverOptions{MasterName: s.opts.MasterName, SentinelAddrs: s.SentinelAddrs(), ContextTimeoutEnabled: true}
	for _, fn := range opts {
		fn(o)
	}
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Admin returns a client of the process srv alone (no retries), closed
// when the test ends.
func (s *Sentinel) Admin(srv *Server) *redis.Client { return s.admin[srv] }

// role returns the replication role of a data node ("master" or "slave")
// and, for a replica, the address of its primary.
func (s *Sentinel) role(ctx context.Context, srv *Server) (role, primary string, err error) {
	repl, err := s.admin[srv].Info(ctx, "replication").Result()
	if err != nil {
		return "", "", fmt.Errorf("INFO replication on %s: %w", srv.Addr, err)
	}
	role = infoField(repl, "role")
	if role == "slave" {
		primary = infoField(repl, "master_host") + ":" + infoField(repl, "master_port")
	}
	return role, primary, nil
}

// Primary returns the data node every Sentinel names as the primary now,
// and fails the test if they disagree or it does not say it is one.
func (s *Sentinel) Primary(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := s.primary(ctx)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return p
}

func (s *Sentinel) primary(ctx context.Context) (*Server, error) {
	var addr string
	for _, sen := range s.sentinels {
		a, err := s.admin[sen].Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.opts.MasterName).StringSlice()
		if err != nil || len(a) != 2 {
			return nil, fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME on %s: %v %v", sen.Addr, a, err)
		}
		if got := a[0] + ":" + a[1]; addr == "" {
			addr = got
		} else if got != addr {
			return nil, fmt.Errorf("the Sentinels disagree about the primary: %s and %s", addr, got)
		}
	}
	for _, d := range s.data {
		if d.Addr == addr {
			if role, _, err := s.role(ctx, d); err != nil || role != "master" {
				return nil, fmt.Errorf("the Sentinels name %s, which reports role %q (%v)", addr, role, err)
			}
			return d, nil
		}
	}
	return nil, fmt.Errorf("the Sentinels name %s, which is not one of ours", addr)
}

// Replica returns the data node that is not the primary.
func (s *Sentinel) Replica(t testing.TB) *Server {
	t.Helper()
	p := s.Primary(t)
	for _, d := range s.data {
		if d != p {
			return d
		}
	}
	return nil
}

// Healthy returns nil when the deployment is ready for a failover test,
// else what is not yet so: both data nodes run, one is the primary and
// lists the other online, the replica reports its link up with no sync in
// progress; every Sentinel names that primary, flags it as nothing but a
// master (no failover in progress), knows the replica as a healthy replica
// of it and knows every other Sentinel, and SENTINEL CKQUORUM passes.
func (s *Sentinel) Healthy(ctx context.Context) error {
	for _, d := range s.data {
		if !d.Running() {
			return fmt.Errorf("%s is not running", d.Addr)
		}
	}
	p, err := s.primary(ctx)
	if err != nil {
		return err
	}
	repl, err := s.admin[p].Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !hasLine(repl, "connected_slaves:1") || !strings.Contains(infoField(repl, "slave0"), "state=online") {
		return fmt.Errorf("primary %s does not list its replica online", p.Addr)
	}
	for _, d := range s.data {
		if d == p {
			continue
		}
		r, err := s.admin[d].Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		for _, want := range []string{"role:slave", "master_link_status:up", "master_sync_in_progress:0", "master_port:" + strconv.Itoa(p.port)} {
			if !hasLine(r, want) {
				return fmt.Errorf("replica %s: no %q in INFO replication", d.Addr, want)
			}
		}
	}
	for _, sen := range s.sentinels {
		a := s.admin[sen]
		m, err := a.Do(ctx, "SENTINEL", "MASTER", s.opts.MasterName).Result()
		if err != nil {
			return fmt.Errorf("SENTINEL MASTER on %s: %w", sen.Addr, err)
		}
		mf := fields(m)
		if mf["flags"] != "master" || mf["num-slaves"] != "1" || mf["num-other-sentinels"] != strconv.Itoa(len(s.sentinels)-1) {
			return fmt.Errorf("sentinel %s: primary flags %q, %s replicas, %s other sentinels", sen.Addr, mf["flags"], mf["num-slaves"], mf["num-other-sentinels"])
		}
		rs, err := a.Do(ctx, "SENTINEL", "REPLICAS", s.opts.MasterName).Slice()
		if err != nil {
			return fmt.Errorf("SENTINEL REPLICAS on %s: %w", sen.Addr, err)
		}
		for _, r := range rs {
			rf := fields(r)
			if rf["flags"] != "slave" || rf["master-link-status"] != "ok" || rf["master-port"] != strconv.Itoa(p.port) {
				return fmt.Errorf("sentinel %s: replica %s:%s flags %q, link %q, of port %s", sen.Addr, rf["ip"], rf["port"], rf["flags"], rf["master-link-status"], rf["master-port"])
			}
		}
		if err := a.Do(ctx, "SENTINEL", "CKQUORUM", s.opts.MasterName).Err(); err != nil {
			return fmt.Errorf("SENTINEL CKQUORUM on %s: %w", sen.Addr, err)
		}
	}
	return nil
}

// fields turns a Sentinel reply (a flat list of names and values, or a map
// under RESP3) into a map.
func fields(v any) map[string]string {
	m := make(map[string]string)
	switch v := v.(type) {
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			k, _ := v[i].(string)
			m[k] = fmt.Sprint(v[i+1])
		}
	case map[any]any:
		for k, val := range v {
			m[fmt.Sprint(k)] = fmt.Sprint(val)
		}
	}
	return m
}

// AwaitHealthy waits until Healthy reports nil, and fails the test if that
// takes too long (30 s plus ten DownAfter).
func (s *Sentinel) AwaitHealthy(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := poll(ctx, s.Healthy); err != nil {
		t.Fatalf("redistest: waiting for the Sentinel deployment to become healthy: %v", err)
	}
}

// Failover runs SENTINEL FAILOVER (a failover without asking the other
// Sentinels, and without waiting for the primary to be down), waits until
// every Sentinel names the replica as the primary, and returns the new
// primary and that time. Then it waits until the old primary has rejoined
// as a replica and the deployment is healthy.
func (s *Sentinel) Failover(t testing.TB) (*Server, time.Duration) {
	t.Helper()
	old := s.Primary(t)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := s.admin[s.sentinels[0]].Do(ctx, "SENTINEL", "FAILOVER", s.opts.MasterName).Err(); err != nil {
		t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	p, took := s.awaitNewPrimary(t, ctx, old)
	s.AwaitHealthy(t)
	return p, took
}

// AwaitPromoted waits until every Sentinel names a primary other than old
// (which was killed, or failed over) and that node reports role master; it
// returns the new primary and how long it waited.
func (s *Sentinel) AwaitPromoted(t testing.TB, old *Server) (*Server, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	return s.awaitNewPrimary(t, ctx, old)
}

func (s *Sentinel) awaitNewPrimary(t testing.TB, ctx context.Context, old *Server) (*Server, time.Duration) {
	t.Helper()
	start := time.Now()
	var p *Server
	err := poll(ctx, func(ctx context.Context) error {
		np, err := s.primary(ctx)
		if err != nil {
			return err
		}
		if np == old {
			return fmt.Errorf("the Sentinels still name %s", old.Addr)
		}
		p = np
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: waiting for a new primary in place of %s: %v", old.Addr, err)
	}
	return p, time.Since(start)
}
