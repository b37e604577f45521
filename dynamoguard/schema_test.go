package dynamoguard_test

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// TestCompositeKeyAndOwnAttributes: a table keyed by a number and a sort
// string, with the guard's attributes renamed: the probe learns the key,
// the token rules hold, a key without its sort part is refused before any
// I/O, and the stale error names the item by both parts.
func TestCompositeKeyAndOwnAttributes(t *testing.T) {
	t.Parallel()
	c := dynamotest.Client(t)
	table := dynamotest.TableName(t, "composite")
	dynamotest.CreateTable(t, c, table, dynamotest.Key{Name: "tenant", Type: types.ScalarAttributeTypeN, SortName: "doc", SortType: types.ScalarAttributeTypeS})
	g := newGuard(t, c, table, dynamoguard.WithAttributes("ver", "once", "gone"))
	ctx := testkit.Context(t)
	k := map[string]types.AttributeValue{"tenant": &types.AttributeValueMemberN{Value: "42"}, "doc": &types.AttributeValueMemberS{Value: "a/b"}}
	with := func(v string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"tenant": k["tenant"], "doc": k["doc"], "value": &types.AttributeValueMemberS{Value: v}}
	}
	if err := g.Put(ctx, with("ten"), 10); err != nil {
		t.Fatal(err)
	}
	var se *fence.StaleError
	if err := g.Put(ctx, with("nine"), 9); !errors.As(err, &se) || se.Current != 10 || se.Resource != "dynamodb://"+table+"/42/a/b" {
		t.Fatalf("stale Put = %v, want a StaleError on dynamodb://%s/42/a/b naming 10", err, table)
	}
	if err := g.Update(ctx, k, 11, expression.Set(expression.Name("value"), expression.Value("eleven"))); err != nil {
		t.Fatal(err)
	}
	it, tok, err := g.Get(ctx, k)
	if err != nil || tok != 11 || it["value"].(*types.AttributeValueMemberS).Value != "eleven" {
		t.Fatalf("Get = %v, %d, %v; want eleven with token 11", it, tok, err)
	}
	raw := map[string]types.AttributeValue{"tenant": k["tenant"], "doc": k["doc"]}
	out := rawGet(t, c, table, raw)
	if _, ok := out["ver"]; !ok {
		t.Fatalf("the renamed version attribute is not stored: %v", out)
	}
	if _, ok := out["lock_version"]; ok {
		t.Fatalf("the default attribute name was used: %v", out)
	}
	if err := g.Delete(ctx, map[string]types.AttributeValue{"tenant": k["tenant"]}, 12); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("Delete without the sort key = %v, want ErrInvalidInput", err)
	}
	if err := g.Put(ctx, map[string]types.AttributeValue{"tenant": k["tenant"], "doc": k["doc"], "ver": &types.AttributeValueMemberN{Value: "99"}}, 12); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("Put setting the renamed version = %v, want ErrInvalidInput", err)
	}
}
