package zklease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease/zklease"
	"github.com/fencekit/fencekit/lease/zklease/zkleasetest"
)

// The servers of zktest.Shared stop when the tests are done, before the
// leak check.
func TestMain(m *testing.M) { goleak.VerifyTestMain(zktest.StopSharedAfter(m)) }

// newBackend connects a Backend to servers, closed when the test ends,
// once its first session is set up.
var newBackend = zkleasetest.NewBackend

// adminConn is a plain go-zookeeper client for the test's own inspection
// and damage.
func adminConn(t testing.TB, servers []string) adminClient {
	t.Helper()
	c, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatalf("zk.Connect: %v", err)
	}
	t.Cleanup(c.Close)
	return adminClient{c}
}

// rawConn is a plain connection of the test's own, for the benchmarks'
// raw recipes: reads as the recipe sends them, without adminClient's syncs.
func rawConn(t testing.TB, servers []string) *zk.Conn {
	t.Helper()
	return adminConn(t, servers).Conn
}

// adminClient is a test's own look at the store: each read is synced
// first. A read is served by the member the connection is on, which may
// not yet have applied what other sessions wrote through other members (a
// release the test just saw return); a sync makes it catch up with the
// leader first.
type adminClient struct{ *zk.Conn }

func (a adminClient) sync(path string) {
	// A failed sync leaves the read as it would have been without it;
	// the read reports the connection's errors.
	_, _ = a.Conn.Sync(path)
}

func (a adminClient) Children(path string) ([]string, *zk.Stat, error) {
	a.sync(path)
	return a.Conn.Children(path)
}

func (a adminClient) Get(path string) ([]byte, *zk.Stat, error) {
	a.sync(path)
	return a.Conn.Get(path)
}

func (a adminClient) Exists(path string) (bool, *zk.Stat, error) {
	a.sync(path)
	return a.Conn.Exists(path)
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// deleteTree deletes path and everything under it, ephemeral nodes of
// other sessions included, as an operator's `deleteall` would.
// The listing is synced first: a read is served by the member the client
// is on, which may not yet have applied the writes of other clients (a
// record created just before, through another member, then made the
// delete fail with "node has children").
func deleteTree(c *zk.Conn, path string) error {
	if _, err := c.Sync(path); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	kids, _, err := c.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range kids {
		if err := deleteTree(c, path+"/"+k); err != nil {
			return err
		}
	}
	if err := c.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

// endSession expires b's session at the store.
func endSession(t testing.TB, b *zklease.Backend) {
	t.Helper()
	server, id, passwd := b.SessionCredentials()
	if id == 0 {
		t.Fatal("endSession: the backend has no session")
	}
	if err := zktest.ExpireSession(testkit.Context(t), server, id, passwd); err != nil {
		t.Fatalf("expire session 0x%x at %s: %v", id, server, err)
	}
}
