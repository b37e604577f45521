package dynamoguard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// careless makes the real server look like a store that ignores
// conditions: it strips them from every request before sending it (the
// real server cannot misbehave on cue, so this wrapper does).
type careless struct {
	*dynamodb.Client
	dropConditions, dropReturnValues bool
}

func (c careless) PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	cp := *in
	if c.dropConditions {
		cp.ConditionExpression, cp.ExpressionAttributeNames, cp.ExpressionAttributeValues = nil, nil, nil
	}
	if c.dropReturnValues {
		cp.ReturnValuesOnConditionCheckFailure = ""
	}
	return c.Client.PutItem(ctx, &cp, optFns...)
}

func (c careless) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	cp := *in
	cp.TransactItems = nil
	for _, it := range in.TransactItems {
		if it.Update != nil {
			u := *it.Update
			if c.dropConditions {
				u.ConditionExpression = nil
			}
			if c.dropReturnValues {
				u.ReturnValuesOnConditionCheckFailure = ""
			}
			it.Update = &u
		}
		cp.TransactItems = append(cp.TransactItems, it)
	}
	return c.Client.TransactWriteItems(ctx, &cp, optFns...)
}

// TestProbeRefusesCarelessStores: a store that ignores conditions, or does
// not return the item of a failed condition, is refused, and so is every
// later write (fail closed), before it writes anything.
func TestProbeRefusesCarelessStores(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	for name, c := range map[string]careless{
		"conditions ignored":                          {dropConditions: true},
		"ReturnValuesOnConditionCheckFailure ignored": {dropReturnValues: true},
	} {
		t.Run(name, func(t *testing.T) {
			c.Client = dynamotest.Client(t)
			g, err := dynamoguard.New(c, table)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Check(testkit.Context(t)); !errors.Is(err, dynamoguard.ErrConditionsIgnored) {
				t.Fatalf("Check = %v, want ErrConditionsIgnored", err)
			}
			if err := g.Put(testkit.Context(t), item("refused-"+name, "v"), 1); !errors.Is(err, dynamoguard.ErrConditionsIgnored) {
				t.Fatalf("Put after a failed probe = %v, want ErrConditionsIgnored", err)
			}
			if it := rawItem(t, table, "refused-"+name); it != nil {
				t.Fatalf("a refused guard wrote %v", it)
			}
		})
	}
}

// overwriteBeforeRetry returns an API option that, once armed, runs write
// once, after the first attempt of a request and before its retry.
func overwriteBeforeRetry(armed *atomic.Bool, write func()) func(*middleware.Stack) error {
	var n atomic.Int32
	return func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("overwriteBeforeRetry",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				if armed.Load() && n.Add(1) == 2 {
					write()
				}
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}
}
