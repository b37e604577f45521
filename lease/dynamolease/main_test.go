package dynamolease_test

import (
	"context"
	"os"
	"testing"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// The tests run against the real DynamoDB-compatible server that
// scripts/services.sh starts (DynamoDB Local) and exports as
// FENCE_DYNAMODB_ENDPOINT; without it they fail.
func TestMain(m *testing.M) { os.Exit(dynamotest.RunMain(m)) }

// newTable creates a throwaway lease table, deleted when t ends.
func newTable(t testing.TB) string {
	t.Helper()
	table := dynamotest.TableName(t, "lease")
	c := dynamotest.Client(t)
	if err := dynamolease.CreateTable(testkit.Context(t), c, table, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dynamotest.Delete(context.Background(), c, table); err != nil {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	return table
}

func newBackend(t testing.TB, table string, opts ...dynamolease.Option) *dynamolease.Backend {
	t.Helper()
	b, err := dynamolease.New(dynamotest.Client(t), table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
