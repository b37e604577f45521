package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// etcdPrefix starts the keys of the demos' leases in etcd; each run's lease
// name is its own, and the epoch key (etcdlease's token base) is shared by
// every run, as it must be for tokens to keep growing.
const etcdPrefix = "fencekit/"

// consensusBackend is a lease backend in etcd or ZooKeeper with the
// inspection the orchestrator uses (driver.Inspector), and the function that
// closes it and its client.
type consensusBackend interface {
	lease.Backend
	driver.Inspector
}

// newConsensusBackend returns the etcdlease or zklease backend of store.
// A ZooKeeper backend asks for a session timeout of ttl: its leases' TTL.
func newConsensusBackend(store LeaseStore, ttl time.Duration) (consensusBackend, func(), error) {
	switch store.Kind {
	case LeaseDynamoDB:
		return newDynamoBackend(store)
	case LeaseEtcd:
		cli, err := clientv3.New(clientv3.Config{Endpoints: store.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("etcd client for %s: %w", strings.Join(store.EtcdEndpoints, ","), err)
		}
		opts := []etcdlease.Option{etcdlease.WithPrefix(etcdPrefix)}
		if store.EtcdMinTTL > 0 {
			opts = append(opts, etcdlease.WithMinTTL(store.EtcdMinTTL))
		}
		b, err := etcdlease.New(cli, opts...)
		if err != nil {
			_ = cli.Close()
			return nil, nil, err
		}
		return b, func() { _ = b.Close(); _ = cli.Close() }, nil
	case LeaseZooKeeper:
		b, err := zklease.New(store.ZooKeeperServers, zklease.WithSessionTimeout(ttl))
		if err != nil {
			return nil, nil, err
		}
		return b, func() { _ = b.Close() }, nil
	}
	return nil, nil, fmt.Errorf("lease store %q is not etcd or zookeeper", store.Kind)
}

// checkConsensusStore connects to the store the way a holder will and
// checks that it can keep leases of ttl: the Manager's limits (etcd's
// whole seconds and minimum) and, on ZooKeeper, that the server grants a
// session timeout of exactly ttl (one outside its minSessionTimeout and
// maxSessionTimeout is changed by the server: a longer one would keep a
// dead holder's lease past its TTL, a shorter one is refused by zklease).
func checkConsensusStore(ctx context.Context, b consensusBackend, store LeaseStore, ttl time.Duration) error {
	if _, err := lease.NewManager(b, ttl); err != nil {
		return fmt.Errorf("leases of %v in %s: %w", ttl, store.Name(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	switch cb := b.(type) {
	case *zklease.Backend:
		if err := cb.Ready(ctx); err != nil {
			return fmt.Errorf("ZooKeeper at %s: %w", strings.Join(store.ZooKeeperServers, ","), err)
		}
		if _, granted := cb.Session(); granted != ttl {
			bounds := "its minSessionTimeout and maxSessionTimeout"
			if store.ZooKeeperBounds != "" {
				bounds = store.ZooKeeperBounds
			}
			return fmt.Errorf("ZooKeeper at %s granted a session timeout of %v when asked for the TTL %v (the server bounds it: %s): choose a --ttl within them",
				strings.Join(store.ZooKeeperServers, ","), granted, ttl, bounds)
		}
	case *etcdlease.Backend:
		// A probe grant of ttl: etcd raises a TTL below its minimum (1.5 ×
		// its election timeout, in whole seconds), which would keep a dead
		// holder's lease longer than the run assumes.
		where := strings.Join(store.EtcdEndpoints, ",")
		g, err := cb.Acquire(ctx, driver.Request{Name: "fencekit-demo-probe/" + RandomID(), Owner: "probe/" + RandomID(), TTL: ttl})
		if err != nil {
			return fmt.Errorf("etcd at %s: a probe lease of %v: %w", where, ttl, err)
		}
		if err := cb.Release(ctx, g); err != nil && !errors.Is(err, lease.ErrNotHeld) {
			return fmt.Errorf("etcd at %s: releasing the probe lease: %w", where, err)
		}
		if g.TTL != ttl {
			return fmt.Errorf("etcd at %s granted a lease of %v when asked for the TTL %v (its minimum, 1.5 × its election timeout in whole seconds): choose --ttl %v or more",
				where, g.TTL, ttl, g.TTL)
		}
	}
	return nil
}
