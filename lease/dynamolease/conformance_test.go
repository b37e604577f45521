package dynamolease_test

import (
	"sync"
	"testing"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/leasetest"
)

// TestConformance runs the backend conformance suite against the real
// server: a table per check, a client (its own connections) per backend.
// Losing data is deleting and re-creating the table, as an operator or a
// restore into an empty table would.
func TestConformance(t *testing.T) {
	t.Parallel()
	var tables sync.Map // lease.Backend -> its table
	leasetest.Run(t, leasetest.Config{
		NewStore: func(t *testing.T) func() lease.Backend {
			table := newTable(t)
			return func() lease.Backend {
				b := newBackend(t, table)
				tables.Store(b, table)
				return b
			}
		},
		LoseData: func(t *testing.T, b lease.Backend) {
			v, _ := tables.Load(b)
			table := v.(string)
			c := dynamotest.Client(t)
			if err := dynamotest.Delete(testkit.Context(t), c, table); err != nil {
				t.Fatal(err)
			}
			if err := dynamolease.CreateTable(testkit.Context(t), c, table, ""); err != nil {
				t.Fatal(err)
			}
		},
		Lacks: map[leasetest.Capability]string{
			leasetest.Watch:      "DynamoDB pushes nothing about one item to a client (Streams are a separate service, with lag); waiters poll",
			leasetest.BatchRenew: "a conditional write renews one item; a TransactWriteItems of several renewals fails whole when one grant is lost, so heartbeats go one request each",
			leasetest.PushLoss:   "grants live in items, not in sessions: nothing ends at the store on its own",
			leasetest.Queue:      "waiters in line (FIFO hand-off): not built. DynamoDB has no clock a condition can read, so a waiter's place could lapse only by the record-version rule (every waiter watching each place ahead of it, unchanged, for a whole TTL before passing it), which makes a line cost a read per waiter ahead and a TTL per dead waiter; see the package doc",
		},
	})
}
