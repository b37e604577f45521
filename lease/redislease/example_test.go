package redislease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
)

// A scheduled job that must run on one replica at a time, under a lease in
// Redis. It needs a Redis server at 127.0.0.1:6379, so go test compiles
// this example but does not run it (it has no Output comment); paste it
// into a program to try it.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	backend, err := redislease.New(client) // also a Sentinel or Cluster client
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	m, err := lease.NewManager(backend, 10*time.Second, lease.WithIdentity("billing-1"))
	if err != nil {
		log.Fatal(err)
	}

	// Bound the wait: a blocked acquire retries a store that does not
	// answer until its context ends, and then returns the store's error.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = m.Run(ctx, "nightly-invoices", func(ctx context.Context, l *lease.Lease) error {
		// ctx ends if the lease is lost; present l.Token() to every
		// fenced write (sqlguard, blobguard).
		fmt.Println("generating invoices with token", l.Token())
		return nil
	})
	switch {
	case errors.Is(err, lease.ErrNotAcquired):
		fmt.Println("another replica ran the job, or Redis could not be reached:", err)
	case errors.Is(err, lease.ErrLost):
		fmt.Println("the lease was lost while the job ran: its writes were fenced:", err)
	case err != nil:
		fmt.Println("the job failed:", err)
	}
}
