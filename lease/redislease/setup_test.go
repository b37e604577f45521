package redislease_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// acquireFailsFast is testkit.AcquireFailsFast, and the Redis error kept
// for errors.As.
func acquireFailsFast(t *testing.T, m *lease.Manager, fix string) error {
	t.Helper()
	err := testkit.AcquireFailsFast(t, m, fix)
	var re redis.Error
	if !errors.As(err, &re) {
		t.Fatalf("Acquire = %v; want the Redis error kept for errors.As", err)
	}
	return err
}

func setupManager(t *testing.T, c redislease.Client) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(newBackend(t, c, "fencekit-setup:"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func userClient(t *testing.T, addr, user, password string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Credentials Redis refuses end a blocking Acquire at once with an error
// naming where the password goes; Check says the same before any lease is
// asked for, and nil with the right password.
func TestSetupRefusedCredentials(t *testing.T) {
	s := redistest.Start(t, "--requirepass", "sekret")
	for _, tc := range []struct{ name, password string }{{"no password", ""}, {"wrong password", "wrong"}} {
		t.Run(tc.name, func(t *testing.T) {
			m := setupManager(t, userClient(t, s.Addr, "", tc.password))
			acquireFailsFast(t, m, "FENCE_REDIS_URL")
			testkit.CheckIsSetup(t, m, "FENCE_REDIS_URL")
		})
	}
	t.Run("right password", func(t *testing.T) {
		m := setupManager(t, userClient(t, s.Addr, "", "sekret"))
		if err := m.Check(testkit.Context(t)); err != nil {
			t.Fatalf("Check = %v, want nil", err)
		}
		l, err := m.Acquire(testkit.Context(t), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(testkit.Context(t))
	})
}

// ACL users (on a server of the test's own) that lack what fencekit needs:
// a blocking Acquire ends at once with an error naming the permissions,
// and Check reports them, also the channel permissions that Acquire does
// not need but waiters do; a user with exactly what fencekit needs passes.
func TestSetupACLPermissions(t *testing.T) {
	s := redistest.Start(t, "--requirepass", "admin")
	admin := userClient(t, s.Addr, "", "admin")
	acl := func(args ...any) {
		t.Helper()
		if err := admin.Do(testkit.Context(t), append([]any{"ACL", "SETUSER"}, args...)...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %v: %v", args, err)
		}
	}
	const keys, chans = "~fencekit-setup:*", "&fencekit-setup:*"
	acl("noeval", "on", ">pw", keys, chans, "+@all", "-evalsha", "-eval")
	acl("otherkeys", "on", ">pw", "~other:*", chans, "+@all")
	acl("noset", "on", ">pw", keys, chans, "+@all", "-set")
	acl("nochannels", "on", ">pw", keys, "resetchannels", "+@all")
	acl("enough", "on", ">pw", keys, chans, "+ping", "+evalsha", "+eval", "+script|load",
		"+get", "+set", "+del", "+exists", "+pexpire", "+pttl", "+time", "+spublish", "+publish", "+ssubscribe", "+subscribe", "+command|info")
	const fix = "permissions fencekit needs"
	for _, user := range []string{"noeval", "otherkeys", "noset"} {
		t.Run(user, func(t *testing.T) {
			m := setupManager(t, userClient(t, s.Addr, user, "pw"))
			acquireFailsFast(t, m, fix)
			testkit.CheckIsSetup(t, m, fix)
		})
	}
	t.Run("nochannels", func(t *testing.T) {
		// Leases work, but waiters would never hear a release.
		m := setupManager(t, userClient(t, s.Addr, "nochannels", "pw"))
		testkit.CheckIsSetup(t, m, "refused now: SPUBLISH, SSUBSCRIBE")
	})
	t.Run("enough", func(t *testing.T) {
		m := setupManager(t, userClient(t, s.Addr, "enough", "pw"))
		if err := m.Check(testkit.Context(t)); err != nil {
			t.Fatalf("Check = %v, want nil", err)
		}
		// The checks and the refused attempts left nothing behind.
		if n, err := admin.DBSize(testkit.Context(t)).Result(); err != nil || n != 0 {
			t.Fatalf("DBSIZE = %d, %v; want 0 keys", n, err)
		}
		l, err := m.Acquire(testkit.Context(t), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// A database number the server does not have is a setup error.
func TestSetupUnknownDatabase(t *testing.T) {
	s := redistest.Start(t, "--databases", "2")
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DB: 5, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m := setupManager(t, c)
	acquireFailsFast(t, m, "database number")
	testkit.CheckIsSetup(t, m, "database number")
}

// What a retry can fix is not a setup error: a replica answering READONLY
// (as during a Sentinel failover) and a server that cannot be reached are
// retried until the context ends, and Check returns their error as it is.
func TestCheckTransientErrorsAreNotSetup(t *testing.T) {
	primary := redistest.Start(t)
	_, port, _ := net.SplitHostPort(primary.Addr)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", port)
	m := setupManager(t, replica.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := m.Acquire(ctx, "jobs")
	if !errors.Is(err, lease.ErrNotAcquired) || errors.Is(err, lease.ErrSetup) || !redis.IsReadOnlyError(err) {
		t.Fatalf("Acquire on a replica = %v; want READONLY retried until the context ended, not ErrSetup", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	m = setupManager(t, c)
	err = m.Check(testkit.Context(t))
	if err == nil || errors.Is(err, lease.ErrSetup) {
		t.Fatalf("Check on %s, where nothing listens = %v; want the connection error, not ErrSetup", addr, err)
	}
}

// The shared Redis is set up for leases.
func TestCheckSharedRedis(t *testing.T) {
	b := newBackend(t, redistest.Shared(t), redistest.Prefix(t))
	m, err := lease.NewManager(b, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(testkit.Context(t)); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
}

// A one-node Redis Cluster set up for leases passes Check, through the
// Cluster client (scripts loaded on every master).
func TestCheckCluster(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	admin := srv.Client()
	ctx := testkit.Context(t)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	for i := 0; ; i++ {
		info, err := admin.ClusterInfo(ctx).Result()
		if err == nil && containsLine(info, "cluster_state:ok") {
			break
		}
		if i > 100 {
			t.Fatalf("cluster never became ok: %v %s", err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m := setupManager(t, c)
	if err := m.Check(ctx); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
	if n, err := admin.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after Check = %d, %v; want 0", n, err)
	}
	// The scripts are loaded.
	renew, release := redislease.ScriptSHAsForTest()
	if ok, err := admin.ScriptExists(ctx, renew, release).Result(); err != nil || !ok[0] || !ok[1] {
		t.Fatalf("SCRIPT EXISTS renew, release = %v, %v; want both loaded by Check", ok, err)
	}
}
