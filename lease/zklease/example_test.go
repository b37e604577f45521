package zklease_test

import (
	"context"
	"log"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// A lease in ZooKeeper: the TTL is at most the session timeout, and a
// session that expires ends every lease of it. (It needs an ensemble, so it
// is compiled, not run.)
func Example() {
	ctx := context.Background()
	backend, err := zklease.New([]string{"zk1:2181", "zk2:2181", "zk3:2181"},
		zklease.WithSessionTimeout(10*time.Second), zklease.WithRoot("/billing/leases"))
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close() // ends the session: every lease of it ends
	m, err := lease.NewManager(backend, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	e, err := lease.NewElection(m, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	err = e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
		// Lead until ctx ends; fence writes with l.Token() (the node's czxid).
		<-ctx.Done()
		return nil
	})
	log.Print(err)
}
