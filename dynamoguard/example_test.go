package dynamoguard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
)

// A holder writes an item with the token of its lease; a holder with an
// older token is refused. (Needs a DynamoDB table "invoices" keyed by the
// string "id"; compile-only.)
func Example() {
	ctx := context.Background()
	var client *dynamodb.Client // dynamodb.NewFromConfig(cfg)
	g, err := dynamoguard.New(client, "invoices")
	if err != nil {
		panic(err)
	}
	token := fence.Token(42) // from a lease: l.Token()
	err = g.Put(ctx, map[string]types.AttributeValue{
		"id":     &types.AttributeValueMemberS{Value: "inv-7"},
		"status": &types.AttributeValueMemberS{Value: "paid"},
	}, token)
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		fmt.Printf("a newer holder (token %d) wrote first; stop\n", stale.Current)
	case errors.Is(err, fence.ErrOutcomeUnknown):
		fmt.Println("the write may or may not have landed; read the item")
	case err != nil:
		panic(err)
	}
}

// Update changes an existing item; the guard adds the token and its
// conditions to the caller's expression.
func ExampleGuard_Update() {
	ctx := context.Background()
	var g *dynamoguard.Guard // dynamoguard.New(client, "invoices")
	err := g.Update(ctx, map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "inv-7"}}, 42,
		expression.Set(expression.Name("status"), expression.Value("sent")).Add(expression.Name("attempts"), expression.Value(1)))
	if errors.Is(err, fence.ErrNotFound) {
		fmt.Println("no such invoice")
	}
}

// Transact commits the caller's writes only if the fence item's token is
// not newer than the holder's.
func ExampleGuard_Transact() {
	ctx := context.Background()
	var g *dynamoguard.Guard
	err := g.Transact(ctx, map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "lease/invoicejob"}}, 42,
		[]types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String("invoices"), Item: map[string]types.AttributeValue{
				"id": &types.AttributeValueMemberS{Value: "inv-8"}, "status": &types.AttributeValueMemberS{Value: "new"},
			}}},
		})
	if errors.Is(err, fence.ErrStaleToken) {
		fmt.Println("stale holder: nothing committed")
	}
}
