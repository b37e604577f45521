package etcdlease_test

import (
	"context"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// A lease over etcd. (It needs a server, so it is compiled, not run.)
func Example() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	backend, err := etcdlease.New(cli, etcdlease.WithPrefix("billing/"))
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	m, err := lease.NewManager(backend, 10*time.Second) // whole seconds, at least Options.MinTTL
	if err != nil {
		log.Fatal(err)
	}
	l, err := m.Acquire(ctx, "nightly-invoices") // woken by a watch when the holder lets go
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
	// Work under l.Context(); present l.Token() to every fenced write.
	_ = l.Token()
}
