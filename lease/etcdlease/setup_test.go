package etcdlease_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// acquireFailsFast is testkit.AcquireFailsFast, and etcdErr kept for
// errors.Is.
func acquireFailsFast(t *testing.T, m *lease.Manager, fix string, etcdErr error) {
	t.Helper()
	if err := testkit.AcquireFailsFast(t, m, fix); !errors.Is(err, etcdErr) {
		t.Fatalf("Acquire = %v; want the etcd error %v kept for errors.Is", err, etcdErr)
	}
}

func authClient(t *testing.T, endpoints []string, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, Username: user, Password: password,
		DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New(%s): %v", user, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// On a cluster of the test's own with authentication enabled: a client
// without credentials, with a wrong password, and users whose roles do not
// cover the backend's prefix (read only, another prefix) end a blocking
// Acquire at once with an error naming the fix, and Check reports the
// same; a user with readwrite on the prefix passes Check and acquires.
func TestSetupAuth(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	admin := cl.Client()
	ctx := testkit.Context(t)
	p := prefix(t)
	end := clientv3.GetPrefixRangeEnd(p)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.UserAdd(ctx, "root", "rootpw"))
	must(admin.RoleAdd(ctx, "root"))
	must(admin.UserGrantRole(ctx, "root", "root"))
	for _, u := range []struct {
		name, key, end string
		perm           clientv3.PermissionType
	}{
		{"fence", p, end, clientv3.PermissionType(clientv3.PermReadWrite)},
		{"reader", p, end, clientv3.PermissionType(clientv3.PermRead)},
		{"elsewhere", "other/", clientv3.GetPrefixRangeEnd("other/"), clientv3.PermissionType(clientv3.PermReadWrite)},
	} {
		must(admin.RoleAdd(ctx, u.name))
		must(admin.RoleGrantPermission(ctx, u.name, u.key, u.end, u.perm))
		must(admin.UserAdd(ctx, u.name, "pw"))
		must(admin.UserGrantRole(ctx, u.name, u.name))
	}
	must(admin.AuthEnable(ctx))
	root := authClient(t, cl.Endpoints(), "root", "rootpw")
	revision := func() int64 {
		t.Helper()
		resp, err := root.Get(ctx, "any")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	manager := func(t *testing.T, cli *clientv3.Client) *lease.Manager {
		return testkit.NewManager(t, newBackend(t, cli, p), 2*time.Second)
	}
	const credentials = "set Username and Password"
	t.Run("no credentials", func(t *testing.T) {
		m := manager(t, cl.Client())
		acquireFailsFast(t, m, credentials, rpctypes.ErrUserEmpty)
		testkit.CheckIsSetup(t, m, credentials)
	})
	t.Run("wrong password", func(t *testing.T) {
		// clientv3.New asks for a token itself, so the backend never
		// sees this one.
		_, err := clientv3.New(clientv3.Config{Endpoints: cl.Endpoints(), Username: "fence", Password: "wrong", DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
		if !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Fatalf("clientv3.New with a wrong password = %v, want %v", err, rpctypes.ErrAuthFailed)
		}
	})
	t.Run("password changed", func(t *testing.T) {
		// The client's password was right when it was made; the operator
		// changed it since (a rotation the service missed): the client's
		// next token request is refused.
		must(root.UserAdd(ctx, "rotated", "old"))
		must(root.UserGrantRole(ctx, "rotated", "fence"))
		cli := authClient(t, cl.Endpoints(), "rotated", "old")
		m := manager(t, cli)
		must(root.UserChangePassword(ctx, "rotated", "new"))
		acquireFailsFast(t, m, "set the right Username and Password", rpctypes.ErrAuthFailed)
		testkit.CheckIsSetup(t, m, "set the right Username and Password")
	})
	const grant = "etcdctl role grant-permission <role> --prefix=true readwrite"
	for _, user := range []string{"reader", "elsewhere"} {
		t.Run(user, func(t *testing.T) {
			m := manager(t, authClient(t, cl.Endpoints(), user, "pw"))
			acquireFailsFast(t, m, grant, rpctypes.ErrPermissionDenied)
			testkit.CheckIsSetup(t, m, grant)
		})
	}
	t.Run("readwrite on the prefix", func(t *testing.T) {
		m := manager(t, authClient(t, cl.Endpoints(), "fence", "pw"))
		before := revision()
		if err := m.Check(testkit.Context(t)); err != nil {
			t.Fatalf("Check = %v, want nil", err)
		}
		if after := revision(); after != before {
			t.Fatalf("Check moved the revision from %d to %d: it wrote something", before, after)
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

// A cluster that cannot be reached is not a setup error: Check returns the
// client's error when its context ends.
func TestCheckUnreachableIsNotSetup(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cli, err := etcdtest.NewClient([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	m := testkit.NewManager(t, newBackend(t, cli, prefix(t)), 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := m.Check(ctx); err == nil || errors.Is(err, lease.ErrSetup) {
		t.Fatalf("Check on %s, where nothing listens = %v; want the client's error, not ErrSetup", addr, err)
	}
}

// A cluster set up for leases passes Check, and the check writes nothing.
func TestCheckCluster(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	cli := cl.Client()
	m := testkit.NewManager(t, newBackend(t, cli, prefix(t)), 2*time.Second)
	before, err := etcdtest.Revision(testkit.Context(t), cli)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(testkit.Context(t)); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
	if after, _ := etcdtest.Revision(testkit.Context(t), cli); after != before {
		t.Fatalf("Check moved the revision from %d to %d", before, after)
	}
}
