package dynamoguard_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// Every Put, Update, Delete and Transact reports one event with its
// outcome, classified from the error the caller got, against the real
// server; a lost answer is reported unknown.
func TestObserverSeesEveryWrite(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	rec := &guardtest.Recorder{}
	ft := newFaultTransport(t)
	g := newGuard(t, ft.client(t, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), table, dynamoguard.WithObserver(rec))
	ctx := testkit.Context(t)
	want := func(op, pk string, token fence.Token, o fence.Outcome) guardtest.Want {
		return guardtest.Want{Guard: "dynamoguard", Class: table, Op: op, Resource: "dynamodb://" + table + "/" + pk, Token: token, Outcome: o}
	}
	err := g.Put(ctx, item("a", "v"), 5)
	rec.One(t, want("put", "a", 5, fence.Accepted), err)
	err = g.Put(ctx, item("a", "w"), 4)
	rec.One(t, want("put", "a", 4, fence.Rejected), err)
	err = g.Update(ctx, key("missing"), 6, expression.Set(expression.Name("value"), expression.Value("x")))
	rec.One(t, want("update", "missing", 6, fence.Failed), err)
	if !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("Update of a missing item: %v", err)
	}
	err = g.Delete(ctx, key("a"), fence.None)
	rec.One(t, want("delete", "a", fence.None, fence.Failed), err)
	err = g.Transact(ctx, key("fence"), 7, nil)
	rec.One(t, want("transaction", "fence", 7, fence.Accepted), err)
	ft.loseNext.Store(true)
	err = g.Put(ctx, item("a", "lost"), 8)
	rec.One(t, want("put", "a", 8, fence.Unknown), err)
}
