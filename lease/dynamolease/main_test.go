package dynamolease_test

import (
	"context"
	"os"
	"testing"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

// The tests run against the real DynamoDB-compatible server that
// scripts/services.sh starts (DynamoDB Local) and exports as
// FENCE_DYNAMODB_ENDPOINT; without it they fail.
func TestMain(m *testing.M) { os.Exit(dynamotest.RunMain(m)) }

// newTable creates a throwaway lease table, deleted when t ends.
func newTable(t testing.TB) string {
	t.Helper()
	c := dynamotest.Client(t)
	return dynamotest.NewTable(t, c, "lease", func(ctx context.Context, table string) error {
		return dynamolease.CreateTable(ctx, c, table, "")
	})
}

func newBackend(t testing.TB, table string, opts ...dynamolease.Option) *dynamolease.Backend {
	t.Helper()
	b, err := dynamolease.New(dynamotest.Client(t), table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
