package zklease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// An ACL that refuses the backend (a digest ACL on its root, set by a
// session of the test's own that authenticated with the digest; the
// backend sends no credentials): a blocking Acquire ends at once with an
// error that names the fix, whether the root exists or must be created
// under the protected node, and Check reports the same; a root the
// backend may create passes Check, which leaves nothing behind.
func TestSetupACLRefusesTheBackend(t *testing.T) {
	ens := zktest.Shared(t, 1)
	servers := ens.Servers()
	admin := adminConn(t, servers)
	if err := admin.AddAuth("digest", []byte("admin:secret")); err != nil {
		t.Fatal(err)
	}
	protected := zktest.Root(t)
	for _, p := range []string{"/fencekit-test", protected} {
		acl := zk.WorldACL(zk.PermAll)
		if p == protected {
			acl = zk.DigestACL(zk.PermAll, "admin", "secret")
		}
		if _, err := admin.Create(p, nil, zk.FlagPersistent, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}

	for _, tc := range []struct{ name, root string }{
		{"root protected", protected},
		{"root to create under a protected node", protected + "/leases"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, servers, zklease.WithRoot(tc.root))
			m := testkit.NewManager(t, b, 2*time.Second)
			fix := "refuses this client on the root " + tc.root
			if err := testkit.AcquireFailsFast(t, m, fix); !errors.Is(err, zk.ErrNoAuth) {
				t.Fatalf("Acquire = %v; want an error matching zk.ErrNoAuth", err)
			}
			if err := testkit.CheckIsSetup(t, m, fix); !errors.Is(err, zk.ErrNoAuth) {
				t.Fatalf("Check = %v; want an error matching zk.ErrNoAuth", err)
			}
		})
	}

	t.Run("root the backend may create", func(t *testing.T) {
		root := zktest.Root(t) + "/deeper/leases"
		b := newBackend(t, servers, zklease.WithRoot(root))
		m := testkit.NewManager(t, b, 2*time.Second)
		if err := m.Check(testkit.Context(t)); err != nil {
			t.Fatalf("Check = %v, want nil", err)
		}
		// Nothing was left: not the root, nor its missing ancestors.
		top := root[:strings.Index(root[len("/fencekit-test/"):], "/")+len("/fencekit-test/")]
		if ok, _, err := admin.Exists(top); err != nil || ok {
			t.Fatalf("after Check, %s exists = %v, %v; want it not created", top, ok, err)
		}
		l, err := m.Acquire(testkit.Context(t), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatal(err)
		}
		if err := m.Check(testkit.Context(t)); err != nil {
			t.Fatalf("Check with the root there = %v, want nil", err)
		}
		kids, _, err := admin.Children(root)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range kids {
			if strings.Contains(k, "check") {
				t.Fatalf("Check left %s/%s behind", root, k)
			}
		}
	})
}

// An ensemble that cannot be reached is not a setup error: Check returns
// when its context ends, with the context's error.
func TestCheckUnreachableIsNotSetup(t *testing.T) {
	b, err := zklease.New([]string{"127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	m := testkit.NewManager(t, b, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := m.Check(ctx); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lease.ErrSetup) {
		t.Fatalf("Check = %v; want the context's error, not ErrSetup", err)
	}
}
