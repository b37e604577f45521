package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/lease/zklease"
	"github.com/fencekit/fencekit/sqlguard"
)

// leaseStore is one lease store the lease commands are tested on: the
// flags and variables that point the command at it, and a way for the
// test to connect a backend of its own (the live holder's) to the same
// namespace.
type leaseStore struct {
	flags   []string
	env     map[string]string
	connect func(t *testing.T) lease.Backend
}

// The TTL of the live holder: long, so that its lease can end before it
// only because it was revoked; renewed often, so that the revoke is found
// soon (the next renewal is the latest the holder may learn of it).
const (
	holderTTL   = 20 * time.Second
	holderRenew = 200 * time.Millisecond
)

func redisStore(t *testing.T, url, mode string, client func(t *testing.T) redis.UniversalClient) leaseStore {
	prefix := redistest.Prefix(t)
	return leaseStore{
		flags: []string{"--store", "redis", "--redis-mode", mode, "--prefix", prefix},
		env:   map[string]string{redisURLVar: url},
		connect: func(t *testing.T) lease.Backend {
			b, err := redislease.New(client(t), redislease.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return b
		},
	}
}

func postgresStore(t *testing.T, session bool) leaseStore {
	schema, _ := newSchema(t)
	if code, _, stderr := fencekit(t, "migrate", "up", "--schema", schema); code != exitOK {
		t.Fatalf("migrate up: %s", stderr)
	}
	kind, mode := storePostgres, pglease.ModeTable
	if session {
		kind, mode = storePostgresSession, pglease.ModeSession
	}
	return leaseStore{
		flags: []string{"--store", kind, "--schema", schema},
		env:   map[string]string{databaseURLVar: testenv.PostgresURL()},
		connect: func(t *testing.T) lease.Backend {
			pool, err := pgxpool.New(testkit.Context(t), testenv.PostgresURL())
			if err != nil {
				t.Fatal(err)
			}
			b, err := pglease.New(pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close(); pool.Close() })
			return b
		},
	}
}

// etcdStore is a one-member etcd started by the test, under a prefix of
// the test's own.
func etcdStore(t *testing.T) leaseStore {
	c := etcdtest.Start(t, 1)
	prefix := "fk-cli-" + testkit.RandHex(4) + "/"
	return leaseStore{
		flags: []string{"--store", "etcd", "--prefix", prefix},
		env:   map[string]string{etcdEndpointsVar: strings.Join(c.Endpoints(), ",")},
		connect: func(t *testing.T) lease.Backend {
			cli, err := etcdtest.NewClient(c.Endpoints())
			if err != nil {
				t.Fatal(err)
			}
			b, err := etcdlease.New(cli, etcdlease.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close(); cli.Close() })
			return b
		},
	}
}

// zkStore is a standalone ZooKeeper started by the test, under a root of
// the test's own.
func zkStore(t *testing.T) leaseStore {
	e := zktest.Start(t, 1, zktest.Config{})
	root := zktest.Root(t)
	return leaseStore{
		flags: []string{"--store", "zookeeper", "--root", root},
		env:   map[string]string{zkServersVar: strings.Join(e.Servers(), ",")},
		connect: func(t *testing.T) lease.Backend {
			b, err := zklease.New(e.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(holderTTL))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			if err := b.Ready(testkit.Context(t)); err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
}

// dynamoStore is a lease table of the test's own in DynamoDB Local.
func dynamoStore(t *testing.T) leaseStore {
	ep, err := dynamotest.Endpoint()
	if err != nil {
		t.Fatal(err)
	}
	table := dynamotest.TableName(t, "lease")
	c := dynamotest.Client(t)
	if err := dynamolease.CreateTable(testkit.Context(t), c, table, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dynamotest.Delete(context.Background(), c, table) })
	return leaseStore{
		flags: []string{"--store", "dynamodb", "--table", table},
		env:   map[string]string{dynamoEndpoint: ep, "AWS_ACCESS_KEY_ID": "fencekit", "AWS_SECRET_ACCESS_KEY": "fencekit"},
		connect: func(t *testing.T) lease.Backend {
			b, err := dynamolease.New(dynamotest.Client(t), table)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
}

// redisClusterStore is a Redis Cluster started by the test.
func redisClusterStore(t *testing.T) leaseStore {
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	return redisStore(t, url, "cluster", func(t *testing.T) redis.UniversalClient { return c.Client(t) })
}

// TestLeaseVerbsOnEveryStore: on each store, a live holder's lease is
// listed and shown, watched, revoked by the command (its context ends at
// its next renewal, long before its TTL; the audit line is written), its
// guarded writes are refused once fence advance pushed the revoked token
// + 1, and the next holder gets a greater token, which watch reports.
func TestLeaseVerbsOnEveryStore(t *testing.T) {
	stores := []struct {
		name  string
		start func(t *testing.T) leaseStore
	}{
		{"redis", func(t *testing.T) leaseStore {
			return redisStore(t, testenv.RedisURL(), "standalone", func(t *testing.T) redis.UniversalClient { return redistest.Shared(t) })
		}},
		{"redis-sentinel", func(t *testing.T) leaseStore {
			s := redistest.StartSentinel(t, redistest.SentinelOptions{})
			addrs := s.SentinelAddrs()
			url := "redis://" + addrs[0] + "?master_name=" + s.MasterName()
			for _, a := range addrs[1:] {
				url += "&addr=" + a
			}
			return redisStore(t, url, "sentinel", func(t *testing.T) redis.UniversalClient { return s.Client(t) })
		}},
		{"redis-cluster", redisClusterStore},
		{"postgres", func(t *testing.T) leaseStore { return postgresStore(t, false) }},
		{"postgres-session", func(t *testing.T) leaseStore { return postgresStore(t, true) }},
		{"etcd", etcdStore},
		{"zookeeper", zkStore},
		{"dynamodb", dynamoStore},
	}
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) { checkLeaseVerbs(t, sc.start(t)) })
	}
}

// cli runs the command with st's variables, and, for the lease commands,
// its flags.
func (st leaseStore) cli(t *testing.T, ctx context.Context, stdout *testkit.SyncBuffer, args ...string) (int, string, string) {
	t.Helper()
	if stdout == nil {
		stdout = new(testkit.SyncBuffer)
	}
	var stderr testkit.SyncBuffer
	getenv := func(k string) string {
		if v, ok := st.env[k]; ok {
			return v
		}
		if k == databaseURLVar {
			return testenv.PostgresURL()
		}
		return ""
	}
	if args[0] == "lease" {
		args = append(args, st.flags...)
	}
	code := run(ctx, args, stdout, &stderr, getenv)
	return code, stdout.String(), stderr.String()
}

func checkLeaseVerbs(t *testing.T, st leaseStore) {
	ctx := testkit.Context(t)
	prefix := "jobs-" + testkit.RandHex(4) + "/"
	name := prefix + "nightly {invoices}"

	// The guarded resource: a sqlguard resource token on PostgreSQL.
	schema, _ := newSchema(t)
	if code, _, stderr := fencekit(t, "migrate", "up", "--schema", schema); code != exitOK {
		t.Fatalf("migrate up: %s", stderr)
	}
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	guard, err := sqlguard.New(sqlguard.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	resource := "invoices-" + testkit.RandHex(4)
	write := func(tok fence.Token) error {
		return guard.BeginFunc(ctx, pool, resource, tok, func(pgx.Tx) error { return nil })
	}

	m := testkit.NewManager(t, st.connect(t), holderTTL, lease.WithRenewInterval(holderRenew), lease.WithIdentity("worker-7"))
	l, err := m.TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	defer l.Release(context.Background())
	tok := l.Token()
	if err := write(tok); err != nil {
		t.Fatalf("the holder's guarded write before the revoke: %v", err)
	}

	// ls and show, as JSON and as a table.
	code, out, errOut := st.cli(t, ctx, nil, "lease", "ls", prefix, "-o", "json")
	var ls []leaseJSON
	if code != exitOK || json.Unmarshal([]byte(out), &ls) != nil {
		t.Fatalf("lease ls -o json = %d, %q, %q", code, out, errOut)
	}
	want := leaseJSON{Name: name, Held: true, Identity: "worker-7", Owner: l.Owner(), Token: uint64(tok)}
	if len(ls) != 1 || ls[0].Name != want.Name || !ls[0].Held || ls[0].Identity != want.Identity || ls[0].Owner != want.Owner || ls[0].Token != want.Token {
		t.Fatalf("lease ls -o json = %+v, want one lease %+v", ls, want)
	}
	code, out, errOut = st.cli(t, ctx, nil, "lease", "ls", prefix)
	if code != exitOK || !strings.Contains(out, "NAME") || !strings.Contains(out, name) || !strings.Contains(out, strconv.FormatUint(uint64(tok), 10)) {
		t.Fatalf("lease ls = %d, %q, %q", code, out, errOut)
	}
	var show leaseJSON
	code, out, errOut = st.cli(t, ctx, nil, "lease", "show", name, "-o", "json")
	if code != exitOK || json.Unmarshal([]byte(out), &show) != nil || show.Owner != l.Owner() || show.Token != uint64(tok) {
		t.Fatalf("lease show -o json = %d, %q, %q", code, out, errOut)
	}

	// watch, until the test is done with it.
	wctx, stopWatch := context.WithCancel(ctx)
	var watchOut testkit.SyncBuffer
	watched := make(chan int, 1)
	go func() {
		code, _, _ := st.cli(t, wctx, &watchOut, "lease", "watch", name, "-o", "json", "--interval", "100ms")
		watched <- code
	}()
	defer func() { stopWatch(); <-watched }()
	events := func(want string, token uint64) []watchEvent {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var evs []watchEvent
			for _, line := range strings.Split(strings.TrimSpace(watchOut.String()), "\n") {
				var e watchEvent
				if json.Unmarshal([]byte(line), &e) == nil {
					evs = append(evs, e)
				}
			}
			if len(evs) > 0 && evs[len(evs)-1].Event == want && evs[len(evs)-1].Token == token {
				return evs
			}
			if time.Now().After(deadline) {
				t.Fatalf("lease watch printed %q; want a last event %q with token %d", watchOut.String(), want, token)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	events("now", uint64(tok))

	// A revoke that names another token is refused and changes nothing.
	if code, _, errOut := st.cli(t, ctx, nil, "lease", "revoke", name, "--token", strconv.FormatUint(uint64(tok)+1, 10)); code != exitFail || !strings.Contains(errOut, "nothing revoked") {
		t.Fatalf("lease revoke --token of another grant = %d, %q", code, errOut)
	}
	if l.Err() != nil {
		t.Fatalf("a refused revoke ended the lease: %v", l.Err())
	}

	// The revoke: audited on stderr (slog) and stdout.
	code, out, errOut = st.cli(t, ctx, nil, "lease", "revoke", name, "--token", strconv.FormatUint(uint64(tok), 10))
	if code != exitOK {
		t.Fatalf("lease revoke = %d, %q, %q", code, out, errOut)
	}
	for _, s := range []string{"revoked", strconv.Quote(name), l.Owner(), fmt.Sprintf("token %d", tok), "by " + who(), fmt.Sprintf("--token %d", tok+1)} {
		if !strings.Contains(out, s) {
			t.Errorf("lease revoke's output %q lacks %q", out, s)
		}
	}
	for _, s := range []string{"lease revoked", "name=", "owner=" + l.Owner(), fmt.Sprintf("token=%d", tok), "by=" + who(), "at="} {
		if !strings.Contains(errOut, s) {
			t.Errorf("lease revoke's log %q lacks %q", errOut, s)
		}
	}

	// The holder learns it at its next renewal at the latest: long before
	// its TTL would have run out.
	select {
	case <-l.Done():
	case <-time.After(holderTTL / 2):
		t.Fatalf("the revoked lease (renewed every %v) was still valid %v after the revoke", holderRenew, holderTTL/2)
	}
	var lost *lease.LostError
	if !errors.As(l.Err(), &lost) {
		t.Fatalf("the revoked lease ended with %v, want a *lease.LostError", l.Err())
	}
	events("ended", 0)

	// Nothing holds it now: a second revoke is refused.
	if code, _, errOut := st.cli(t, ctx, nil, "lease", "revoke", name); code != exitFail || !strings.Contains(errOut, "nothing holds it") {
		t.Fatalf("lease revoke of a free name = %d, %q", code, errOut)
	}

	// fence advance pushes the revoked token + 1: the revoked holder's next
	// guarded write is refused as stale at once; a lower push is refused.
	if code, out, errOut := st.cli(t, ctx, nil, "fence", "advance", "--token", strconv.FormatUint(uint64(tok)+1, 10), "--schema", schema, resource); code != exitOK {
		t.Fatalf("fence advance = %d, %q, %q", code, out, errOut)
	}
	var stale *fence.StaleError
	if err := write(tok); !errors.As(err, &stale) || stale.Current != tok+1 {
		t.Fatalf("the revoked holder's guarded write after fence advance = %v, want stale against %d", err, tok+1)
	}
	if code, _, errOut := st.cli(t, ctx, nil, "fence", "advance", "--token", strconv.FormatUint(uint64(tok), 10), "--schema", schema, resource); code != exitFail || !strings.Contains(errOut, fmt.Sprintf("already has token %d", tok+1)) {
		t.Fatalf("fence advance with a lower token = %d, %q; want a refusal naming token %d", code, errOut, tok+1)
	}

	// The next holder: a greater token, its writes accepted, watch sees it.
	next, err := testkit.NewManager(t, st.connect(t), holderTTL).TryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("TryAcquire after the revoke: %v", err)
	}
	if next.Token() <= tok {
		t.Fatalf("the next grant's token %d <= the revoked %d", next.Token(), tok)
	}
	if err := write(next.Token()); err != nil {
		t.Fatalf("the next holder's guarded write: %v", err)
	}
	evs := events("granted", uint64(next.Token()))
	if evs[0].Event != "now" || evs[0].Token != uint64(tok) {
		t.Fatalf("watch began with %+v, want the revoked grant", evs[0])
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stopWatch()
	if code := <-watched; code != exitOK {
		t.Fatalf("lease watch exited %d", code)
	}
	watched <- exitOK
	if code, out, _ := st.cli(t, ctx, nil, "lease", "ls", prefix, "-o", "json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("lease ls after every release = %d, %q", code, out)
	}
}

func TestLeaseUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"lease"}, exitUsage, "missing subcommand"},
		{[]string{"lease", "rm", "x"}, exitUsage, "unknown subcommand"},
		{[]string{"lease", "show"}, exitUsage, "takes one lease NAME"},
		{[]string{"lease", "show", "a", "b"}, exitUsage, "takes one lease NAME"},
		{[]string{"lease", "ls", "a", "b"}, exitUsage, "at most one PREFIX"},
		{[]string{"lease", "show", "x", "-o", "yaml"}, exitUsage, "-o is table or json"},
		{[]string{"lease", "revoke", "bad\x01name", "--store", "redis"}, exitUsage, "control character"},
		{[]string{"lease", "watch", "x", "--interval", "0", "--store", "redis"}, exitUsage, "--interval must be positive"},
		{[]string{"lease", "ls"}, exitUsage, "pass --store"},
		{[]string{"lease", "ls", "--store", "mongo"}, exitUsage, "unknown --store"},
		{[]string{"lease", "ls", "--store", "etcd"}, exitFail, "set FENCE_ETCD_ENDPOINTS"},
		{[]string{"lease", "ls", "--store", "dynamodb", "--url", "http://127.0.0.1:1"}, exitFail, "--table is required"},
		{[]string{"lease", "ls", "--store", "zookeeper", "--prefix", "p", "--url", "127.0.0.1:1"}, exitFail, "--prefix is for redis, etcd and dynamodb"},
	} {
		code, _, errOut := (leaseStore{env: map[string]string{databaseURLVar: ""}}).cli(t, context.Background(), nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q = %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	if code, out, _ := (leaseStore{}).cli(t, context.Background(), nil, "lease", "help"); code != exitOK || !strings.Contains(out, "fencekit lease revoke NAME") {
		t.Errorf("lease help = %d, %q", code, out)
	}
}
