package dynamoguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// TestRetriedUpdateAfterSameTokenWrite: the first try of an ADD lands and
// its reply is lost; before the SDK's retry arrives, the same holder (the
// same token) updates the item again. The retry cannot tell that write
// from its own first try and adds a second time: the guard must not report
// that as one clean update, but as an unknown outcome.
func TestRetriedUpdateAfterSameTokenWrite(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	g, arm, between := retryRace(t, table, func(other *dynamoguard.Guard) error {
		return other.Update(context.Background(), key("k"), 3, expression.Add(expression.Name("count"), expression.Value(1)))
	})
	if err := g.Put(testkit.Context(t), item("k", "v"), 3); err != nil {
		t.Fatal(err)
	}
	arm()
	err := g.Update(testkit.Context(t), key("k"), 3, expression.Add(expression.Name("count"), expression.Value(1)))
	if err := <-between; err != nil {
		t.Fatal(err)
	}
	got := number(t, rawItem(t, table, "k"), "count")
	if got != "2" && !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Update = %v with count = %s after two ADDs of 1 (one retried by the SDK); want 2, or an error matching fence.ErrOutcomeUnknown", err, got)
	}
	// Without a retry, a second update with the same token is a clean one.
	if err := g.Update(testkit.Context(t), key("k"), 3, expression.Add(expression.Name("count"), expression.Value(1))); err != nil {
		t.Fatalf("a plain update with the same token = %v", err)
	}
}
