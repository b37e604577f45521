package dynamoguard_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// rawItem reads an item as stored, the guard's attributes included.
func rawItem(t *testing.T, table, pk string) map[string]types.AttributeValue {
	t.Helper()
	return rawGet(t, dynamotest.Client(t), table, key(pk))
}

func rawGet(t *testing.T, c *dynamodb.Client, table string, k map[string]types.AttributeValue) map[string]types.AttributeValue {
	t.Helper()
	out, err := c.GetItem(testkit.Context(t), &dynamodb.GetItemInput{TableName: aws.String(table), Key: k, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func number(t *testing.T, it map[string]types.AttributeValue, attr string) string {
	t.Helper()
	n, ok := it[attr].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("%s = %#v, want a number", attr, it[attr])
	}
	return n.Value
}

// TestRetriedUpdateAppliesOnce: the server applies an update, its reply is
// lost, and the SDK retries the same request. The retry's condition fails
// on the write's own nonce; the guard reports success, and the ADD was
// applied once, not twice.
func TestRetriedUpdateAppliesOnce(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	ft := newFaultTransport(t)
	g := newGuard(t, ft.client(t), table)
	if err := g.Put(testkit.Context(t), item("k", "v"), 3); err != nil {
		t.Fatal(err)
	}
	before := ft.requests.Load()
	ft.loseNext.Store(true)
	if err := g.Update(testkit.Context(t), key("k"), 3, expression.Add(expression.Name("count"), expression.Value(1))); err != nil {
		t.Fatalf("Update whose first reply was lost and whose retry found its own write = %v, want nil", err)
	}
	if sent := ft.requests.Load() - before; sent != 2 {
		t.Fatalf("the update sent %d requests, want 2 (the lost one and the SDK's retry)", sent)
	}
	if got := number(t, rawItem(t, table, "k"), "count"); got != "1" {
		t.Fatalf("count = %s after one Update retried by the SDK, want 1", got)
	}
}

// retryRace returns a guard on table whose next write, once arm is
// called, loses its first reply and is retried by the SDK only after
// between has written through another guard; between's error arrives on
// the channel.
func retryRace(t *testing.T, table string, between func(other *dynamoguard.Guard) error) (g *dynamoguard.Guard, arm func(), done <-chan error) {
	ft := newFaultTransport(t)
	other := newGuard(t, dynamotest.Client(t), table)
	errs := make(chan error, 1)
	var armed atomic.Bool
	client := ft.client(t, func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, overwriteBeforeRetry(&armed, func() { errs <- between(other) }))
	})
	return newGuard(t, client, table), func() { armed.Store(true); ft.loseNext.Store(true) }, errs
}

// TestRetriedPutOverwrittenIsAmbiguous: the first try lands, a newer
// holder writes before the retry arrives, the retry is refused as stale.
// The guard must not report a clean rejection (the first try changed the
// item): it reports the outcome unknown, joined with the stale error.
func TestRetriedPutOverwrittenIsAmbiguous(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	g, arm, newer := retryRace(t, table, func(other *dynamoguard.Guard) error {
		return other.Put(context.Background(), item("k", "newer"), 9)
	})
	arm()
	err := g.Put(testkit.Context(t), item("k", "mine"), 5)
	if err := <-newer; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Put = %v, want an error matching both fence.ErrOutcomeUnknown and fence.ErrStaleToken", err)
	}
	if got := number(t, rawItem(t, table, "k"), "lock_version"); got != "9" {
		t.Fatalf("lock_version = %s, want 9", got)
	}
}

// TestDeleteLeavesTombstone: Delete keeps the token, so a stale holder can
// neither bring the item back nor update it, Update and Get report it
// missing, and a newer holder's Put replaces it.
func TestDeleteLeavesTombstone(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	g := newGuard(t, dynamotest.Client(t), table)
	ctx := testkit.Context(t)
	if err := g.Put(ctx, item("k", "v4"), 4); err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(ctx, key("k"), 3); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Delete with an older token = %v, want ErrStaleToken", err)
	}
	if err := g.Delete(ctx, key("k"), 6); err != nil {
		t.Fatal(err)
	}
	var se *fence.StaleError
	if err := g.Put(ctx, item("k", "back"), 5); !errors.As(err, &se) || se.Current != 6 || se.Presented != 5 {
		t.Fatalf("Put with token 5 over a tombstone of 6 = %v, want a StaleError naming 5 and 6", err)
	}
	var nf *fence.NotFoundError
	if _, _, err := g.Get(ctx, key("k")); !errors.As(err, &nf) || nf.Tombstone != 6 {
		t.Fatalf("Get of a tombstone = %v, want a NotFoundError with Tombstone 6", err)
	}
	if err := g.Update(ctx, key("k"), 7, expression.Set(expression.Name("value"), expression.Value("x"))); !errors.Is(err, fence.ErrNotFound) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Update of a tombstone with a newer token = %v, want ErrNotFound", err)
	}
	if err := g.Update(ctx, key("k"), 5, expression.Set(expression.Name("value"), expression.Value("x"))); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Update of a tombstone with an older token = %v, want ErrStaleToken", err)
	}
	if err := g.Put(ctx, item("k", "v6"), 6); err != nil {
		t.Fatalf("Put with the tombstone's token: %v", err)
	}
	v, tok, err := g.Get(ctx, key("k"))
	if err != nil || tok != 6 || v["value"].(*types.AttributeValueMemberS).Value != "v6" {
		t.Fatalf("Get = %v, %d, %v; want v6 with token 6", v, tok, err)
	}
	if _, ok := v["lock_version"]; ok {
		t.Fatalf("Get returned the guard's own attributes: %v", v)
	}
}

// TestTransactStaleCommitsNothing: a fenced transaction with an older token
// writes none of the caller's items; one canceled by the caller's own
// condition reports ErrCanceled, not a stale token.
func TestTransactStaleCommitsNothing(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	g := newGuard(t, dynamotest.Client(t), table)
	ctx := testkit.Context(t)
	if err := g.Transact(ctx, key("fence"), 8, nil); err != nil {
		t.Fatal(err)
	}
	writes := []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(table), Item: item("a", "stale")}},
		{Put: &types.Put{TableName: aws.String(table), Item: item("b", "stale")}},
	}
	var se *fence.StaleError
	if err := g.Transact(ctx, key("fence"), 7, writes); !errors.As(err, &se) || se.Current != 8 {
		t.Fatalf("Transact with token 7 = %v, want a StaleError naming 8", err)
	}
	for _, pk := range []string{"a", "b"} {
		if it := rawItem(t, table, pk); it != nil {
			t.Fatalf("a stale transaction wrote %s: %v", pk, it)
		}
	}
	own := []types.TransactWriteItem{{ConditionCheck: &types.ConditionCheck{
		TableName: aws.String(table), Key: key("a"), ConditionExpression: aws.String("attribute_exists(pk)"),
	}}}
	var tce *types.TransactionCanceledException
	if err := g.Transact(ctx, key("fence"), 9, own); !errors.Is(err, dynamoguard.ErrCanceled) || errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &tce) {
		t.Fatalf("Transact canceled by the caller's condition = %v, want ErrCanceled with the exception", err)
	}
	if got := number(t, rawItem(t, table, "fence"), "lock_version"); got != "8" {
		t.Fatalf("the fence advanced to %s in a canceled transaction", got)
	}
	if err := g.Transact(ctx, key("fence"), 9, writes); err != nil {
		t.Fatal(err)
	}
	if got := number(t, rawItem(t, table, "fence"), "lock_version"); got != "9" {
		t.Fatalf("fence = %s after a committed transaction with token 9", got)
	}
}

// TestBadInputBeforeIO: bad arguments are refused before any request, with
// every problem reported.
func TestBadInputBeforeIO(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	ft := newFaultTransport(t)
	g := newGuard(t, ft.client(t), table)
	before := ft.requests.Load()
	ctx := testkit.Context(t)
	cases := map[string]error{
		"zero token":         g.Put(ctx, item("k", "v"), fence.None),
		"huge token":         g.Put(ctx, item("k", "v"), 1<<63),
		"nil item":           g.Put(ctx, nil, 1),
		"reserved attribute": g.Put(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}, "lock_version": &types.AttributeValueMemberN{Value: "9"}}, 1),
		"no key":             g.Put(ctx, map[string]types.AttributeValue{"value": &types.AttributeValueMemberS{Value: "v"}}, 1),
		"wrong key type":     g.Delete(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberN{Value: "1"}}, 1),
		"nil key":            g.Update(ctx, nil, 1, expression.Set(expression.Name("a"), expression.Value(1))),
		"too many items":     g.Transact(ctx, key("f"), 1, make([]types.TransactWriteItem, 100)),
	}
	for name, err := range cases {
		if !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidInput", name, err)
		}
	}
	if !errors.Is(cases["zero token"], fence.ErrInvalidToken) {
		t.Errorf("zero token: %v, want fence.ErrInvalidToken too", cases["zero token"])
	}
	if n := ft.requests.Load() - before; n != 0 {
		t.Fatalf("bad input sent %d requests", n)
	}
	if _, err := dynamoguard.New(nil, ""); err == nil || !strings.Contains(err.Error(), "nil client") || !strings.Contains(err.Error(), "empty table") {
		t.Fatalf("New(nil, \"\") = %v, want both problems", err)
	}
}

// TestMissingTableIsSetupError: a guard over a table that does not exist
// says so, with the fix.
func TestMissingTableIsSetupError(t *testing.T) {
	t.Parallel()
	g, err := dynamoguard.New(dynamotest.Client(t), dynamotest.TableName(t, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	var se *fence.SetupError
	if err := g.Check(testkit.Context(t)); !errors.Is(err, fence.ErrNoTable) || !errors.As(err, &se) || !strings.Contains(se.Fix, "create the table") {
		t.Fatalf("Check on a missing table = %v, want a *fence.SetupError matching fence.ErrNoTable", err)
	}
	if err := newGuard(t, dynamotest.Client(t), newTable(t)).Check(testkit.Context(t)); err != nil {
		t.Fatalf("Check on a table set up = %v", err)
	}
	err = g.Put(testkit.Context(t), item("k", "v"), 1)
	if !errors.Is(err, fence.ErrNoTable) || !errors.Is(err, fence.ErrSetup) || !errors.As(err, &se) || se.Fix == "" {
		t.Fatalf("Put on a missing table = %v, want a *fence.SetupError matching fence.ErrNoTable", err)
	}
}

// TestUpdateBuilderIsNotChanged: one update builder, shared by goroutines
// and reused, works every time: the guard adds its actions to its own
// expression, not to the caller's builder (whose copies share their
// operations). An empty builder fences the item alone; every kind of
// action (SET, REMOVE, ADD) combines with the guard's.
func TestUpdateBuilderIsNotChanged(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	g := newGuard(t, dynamotest.Client(t), table)
	ctx := testkit.Context(t)
	if err := g.Put(ctx, item("k", "v"), 1); err != nil {
		t.Fatal(err)
	}
	shared := expression.Add(expression.Name("count"), expression.Value(1))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if err := g.Update(ctx, key("k"), fence.Token(2+i%2), shared); err != nil && !errors.Is(err, fence.ErrStaleToken) {
				t.Errorf("Update with a shared builder: %v", err)
			}
		})
	}
	wg.Wait()
	built, err := expression.NewBuilder().WithUpdate(shared).Build()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(aws.ToString(built.Update()), "SET") || len(built.Names()) != 1 {
		t.Fatalf("the caller's builder was changed: %q %v", aws.ToString(built.Update()), built.Names())
	}
	if err := g.Update(ctx, key("k"), 3, expression.UpdateBuilder{}); err != nil {
		t.Fatalf("Update with an empty builder: %v", err)
	}
	if err := g.Update(ctx, key("k"), 4, expression.Set(expression.Name("a"), expression.Value("x")).Remove(expression.Name("value")).Add(expression.Name("count"), expression.Value(10))); err != nil {
		t.Fatalf("Update with SET, REMOVE and ADD: %v", err)
	}
	it := rawItem(t, table, "k")
	if _, ok := it["value"]; ok || number(t, it, "lock_version") != "4" || it["a"].(*types.AttributeValueMemberS).Value != "x" {
		t.Fatalf("item after the updates: %v", it)
	}
}
