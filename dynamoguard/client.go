package dynamoguard

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fencekit/fencekit/internal/awsattempt"
)

// counted returns the per-call option function that makes tr count the
// call's HTTP attempts (package awsattempt).
func counted(tr *awsattempt.Tracker) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) { tr.Add(&o.APIOptions) }
}

// Client is the part of *dynamodb.Client a Guard uses: only the operations
// it calls, with the SDK's per-call option functions. *dynamodb.Client
// satisfies it, and so can a wrapper that injects faults or counts calls.
// A Guard passes option functions that must be applied (as
// *dynamodb.Client does) for it to tell a request that was never sent from
// one whose outcome is unknown; if they are ignored, every transport error
// is treated as an unknown outcome. DescribeTable is called by the probe
// only, and DeleteItem only to remove the probe's scratch items.
type Client interface {
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

var _ Client = (*dynamodb.Client)(nil)
